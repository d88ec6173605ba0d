"""OpenTelemetry spans: optional, off by default, and free when off.

Turn it on per object (``Publisher(driver, tracing=True)``, ``Consumer(driver, tracing=True)``) or
for every one made afterwards (``mscheduler.observability.tracing.enable()``); it needs ``opentelemetry-api``
(``pip install 'mscheduler[otel]'``) and, to export anything, an SDK configured by the
application. With tracing off no OpenTelemetry module is imported and no span object is made.

Spans (tracer ``mscheduler``):

* ``mscheduler send`` (PRODUCER) around ``send`` / ``send_many``. The W3C trace context of this
  span (``traceparent``, ``tracestate``) is stored with each task it inserts, in the task
  document's top-level ``trace`` field: apart from the params and the options, so it changes no
  uniqueness hash and nothing a claim reads. A ``reset_finished`` send keeps the first send's
  context.
* ``mscheduler claim`` (INTERNAL) around each claim command of a consumer.
* ``mscheduler run <name>`` (CONSUMER) around an attempt: the handler and the write of its
  outcome. Its parent is the sending span (extracted from the task), so one trace shows the
  request that sent a task and the work it caused; it links to the claim that took the task. It
  carries the key, attempt number, worker id and outcome; an outcome other than success marks it
  as an error. Spans the handler makes are its children.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mscheduler.domain.exceptions import InvalidInput

if TYPE_CHECKING:
    from mscheduler.drivers.base import ClaimedTask

__all__ = ["TaskTracer", "available", "disable", "enable", "enabled", "tracer_for"]

T = TypeVar("T")
TRACER_NAME = "mscheduler"
_enabled = False


def enable() -> None:
    """Trace every ``Publisher`` and ``Consumer`` made from now on (unless given
    ``tracing=False``). Raises ``InvalidInput`` if ``opentelemetry-api`` is missing."""
    global _enabled
    if not available():
        raise InvalidInput(_MISSING)
    _enabled = True


def disable() -> None:
    """Undo ``enable()`` for objects made from now on."""
    global _enabled
    _enabled = False


def enabled() -> bool:
    return _enabled


def available() -> bool:
    """Is ``opentelemetry-api`` installed?"""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


_MISSING = "tracing needs OpenTelemetry: pip install 'mscheduler[otel]'"


def tracer_for(tracing: bool | None) -> TaskTracer | None:
    """The tracer of a publisher or consumer: None (nothing traced) unless ``tracing`` is True,
    or None and ``enable()`` was called."""
    if tracing is None:
        tracing = _enabled
    if not isinstance(tracing, bool):
        raise InvalidInput("tracing: True, False or None")
    if not tracing:
        return None
    if not available():
        raise InvalidInput(_MISSING)
    return TaskTracer()


class TaskTracer:
    """Spans of one publisher or consumer (made only when tracing is on)."""

    def __init__(self) -> None:
        from opentelemetry import propagate, trace

        from mscheduler.domain.version import __version__

        self._trace = trace
        self._propagate = propagate
        self._tracer = trace.get_tracer(TRACER_NAME, __version__)
        self._last_claim: Any = None  # the span context of the newest claim (linked by runs)

    # -- publisher --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def sending(self, keys: Sequence[str], names: Sequence[str]) -> Iterator[None]:
        """The ``mscheduler send`` span, current while the tasks are prepared and inserted."""
        attributes: dict[str, Any] = {"mscheduler.task_count": len(keys)}
        if len(keys) == 1:
            attributes["mscheduler.key"] = keys[0]
        if names:
            attributes["mscheduler.names"] = sorted(set(names))
        kind = self._trace.SpanKind.PRODUCER
        with self._tracer.start_as_current_span("mscheduler send", kind=kind, attributes=attributes):
            yield

    def carrier(self) -> dict[str, str] | None:
        """The current trace context in W3C form (stored with a task), None if there is none."""
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier)
        return carrier or None

    # -- consumer ---------------------------------------------------------------------------------

    async def claim(
        self, call: Awaitable[list[ClaimedTask]], worker_id: str, asked: int
    ) -> list[ClaimedTask]:
        """Run a claim command inside a ``mscheduler claim`` span."""
        attributes: dict[str, Any] = {"mscheduler.worker_id": worker_id, "mscheduler.claim_asked": asked}
        with self._tracer.start_as_current_span("mscheduler claim", attributes=attributes) as span:
            claimed = await call
            span.set_attribute("mscheduler.claimed", len(claimed))
            if claimed:
                self._last_claim = span.get_span_context()
            return claimed

    def running(self, attempt: Awaitable[T], claimed: ClaimedTask, worker_id: str) -> Coroutine[Any, Any, T]:
        """``attempt`` (a consumer's run of a claimed task) inside a ``mscheduler run`` span whose
        parent is the task's sender."""
        links = [self._trace.Link(self._last_claim)] if self._last_claim is not None else []
        return self._run(attempt, claimed, worker_id, links)

    async def _run(self, attempt: Awaitable[T], claimed: ClaimedTask, worker_id: str, links: list[Any]) -> T:
        trace: Mapping[str, str] | None = getattr(claimed, "trace", None)
        parent = self._propagate.extract(dict(trace)) if trace else None
        attributes: dict[str, Any] = {
            "mscheduler.key": claimed.key,
            "mscheduler.name": claimed.name,
            "mscheduler.attempt": claimed.attempt_no,
            "mscheduler.worker_id": worker_id,
        }
        with self._tracer.start_as_current_span(
            f"mscheduler run {claimed.name}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        ):
            return await attempt

    def on_consumer_event(self, event: str, data: dict[str, Any]) -> None:
        """A consumer listener: its ``finished`` event (emitted inside the attempt, so the run
        span is current) sets the span's outcome."""
        if event != "finished":
            return
        span = self._trace.get_current_span()
        if not span.is_recording():
            return
        outcome = str(data.get("outcome"))
        span.set_attribute("mscheduler.outcome", outcome)
        if outcome != "succeeded":
            error = data.get("error") or {}
            message = f"{error.get('type', outcome)}: {error.get('message', '')}".rstrip(": ")
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))
