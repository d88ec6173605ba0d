"""Prometheus metrics: what this process did, and what the store holds.

Needs the ``metrics`` extra (``pip install 'mscheduler[metrics]'``, prometheus-client).

* Counters and histograms per task name, fed by events: a consumer's listener events
  (``claimed``, ``finished``) and a publisher's ``sent`` events. They count what *this process*
  did; sum them over your processes in PromQL.
* Gauges of the store (tasks pending / running per name, the oldest due pending task's age per
  name, live workers; per fairness key its due tasks and the oldest one's wait), computed when
  scraped from ``Operations`` — one aggregation of the tasks (``Operations.stats(window=None)``,
  a covered index scan of the pending and running tasks), one of the due tasks with a fairness
  key (``Operations.key_waits``, covered too) and one read of the workers — at most once per
  ``cache_seconds``, whoever scrapes.

Label sets are bounded: at most ``MAX_NAMES`` task names get series of their own; events and
store gauges of further names are counted under the name ``OTHER_NAME`` (a process whose
publishers send ever new names keeps a bounded registry and a bounded scrape).

Each ``Metrics`` has its own ``CollectorRegistry`` (not prometheus_client's global one), so two
in one process, or in tests, do not collide. Serve it with ``metrics.serve(port)`` (prometheus
client's HTTP server, what ``mscheduler worker --metrics-port`` does), mount ``metrics.asgi_app()``
at ``/metrics`` in an ASGI app, or call ``await metrics.render()``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, make_asgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mscheduler.domain.clock import Clock
from mscheduler.domain.exceptions import MSchedulerError
from mscheduler.domain.fairness import KeyWait
from mscheduler.domain.stats import TaskStats
from mscheduler.drivers.base import Driver
from mscheduler.operations import Operations

log = logging.getLogger("mscheduler.metrics")

DEFAULT_CACHE_SECONDS = 5.0
# how long a scrape on prometheus_client's server thread waits for the store's numbers
DEFAULT_REFRESH_TIMEOUT = 10.0
GAUGE_STATUSES = ("pending", "running")
MAX_NAMES = 1000  # task names with series of their own
MAX_KEYS = 100  # fairness keys with series of their own: those whose oldest due task waits longest
OTHER_NAME = "_other"  # the label of every name past MAX_NAMES (a task name never starts with "_")
# seconds: handlers from a few milliseconds to an hour
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
)
QUEUE_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600)

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class EventSource(Protocol):
    """What ``Metrics.watch`` takes: a ``Consumer`` or a ``Publisher`` (the runtime's classes, read
    through this protocol so that observability sits below the runtime)."""

    def add_listener(self, listener: Callable[[str, dict[str, Any]], None]) -> None: ...


class WorkerSource(EventSource, Protocol):
    """A consumer, for ``serve_worker_metrics``: its events, and the store it runs on."""

    driver: Driver


@dataclass(slots=True, frozen=True)
class _Snapshot:
    stats: TaskStats
    live_workers: int
    taken: float  # the clock's monotonic time
    key_waits: list[KeyWait]


class Metrics:
    """The metrics of one process (see the module's docstring).

    :param operations: where the store's gauges come from; None: no store gauges (a process
        that only publishes, say).
    :param cache_seconds: scrapes within this time of the last store read reuse its numbers.
    :param clock: for the cache's age (``monotonic()``); tests pass a ``FakeClock``.
    """

    def __init__(
        self,
        operations: Operations | None = None,
        *,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        refresh_timeout: float = DEFAULT_REFRESH_TIMEOUT,
        clock: Clock | None = None,
    ) -> None:
        if cache_seconds < 0 or refresh_timeout <= 0:
            raise ValueError("cache_seconds must be >= 0 and refresh_timeout positive")
        self.operations = operations
        self.cache_seconds = cache_seconds
        self.refresh_timeout = refresh_timeout
        self._monotonic = clock.monotonic if clock is not None else time.monotonic
        self.registry = CollectorRegistry()
        r = self.registry
        self.sent = Counter(
            "mscheduler_tasks_sent",
            "Tasks sent by this process's publishers; result: created or exists (the key existed).",
            ["name", "result"],
            registry=r,
        )
        self.claimed = Counter(
            "mscheduler_attempts_claimed",
            "Attempts claimed by this process's consumers.",
            ["name"],
            registry=r,
        )
        self.finished = Counter(
            "mscheduler_attempts_finished",
            "Attempts ended in this process's consumers, by outcome: succeeded, failed, lost, "
            "rejected, released, revoked, snoozed, cancelled.",
            ["name", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "mscheduler_attempt_duration_seconds",
            "How long attempts ran in this process, from claim to outcome (every outcome).",
            ["name"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "mscheduler_queue_wait_seconds",
            "From when a task was due (run_at or retry time) to its claim by this process.",
            ["name"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "mscheduler_attempts_running",
            "Attempts running in this process's consumers.",
            ["name"],
            registry=r,
        )
        self._snapshot: _Snapshot | None = None
        self._store_up = 0
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._server: Any = None
        self._known_names: set[str] = set()  # every name with series of its own (at most MAX_NAMES)
        if operations is not None:
            r.register(_StoreCollector(self))

    # -- events ------------------------------------------------------------------------------

    def watch(self, *sources: EventSource) -> None:
        """Count what these consumers and publishers do (adds a listener to each)."""
        for source in sources:
            if not callable(getattr(source, "add_listener", None)):
                raise TypeError(f"watch() takes consumers and publishers, got {type(source).__name__}")
        for source in sources:
            source.add_listener(self.on_event)

    def label(self, name: str) -> str:
        """The ``name`` label of a task name: itself while fewer than ``MAX_NAMES`` names have
        series, ``OTHER_NAME`` for the names after that."""
        known = self._known_names
        if name in known:
            return name
        if len(known) < MAX_NAMES:
            known.add(name)
            return name
        return OTHER_NAME

    def on_event(self, event: str, data: dict[str, Any]) -> None:
        """A listener of consumers and publishers alike: their events do not overlap (a
        publisher's ``sent``; a consumer's ``claimed``, ``finished``, ...)."""
        if event == "sent":
            self.on_publisher_event(event, data)
        else:
            self.on_consumer_event(event, data)

    def on_consumer_event(self, event: str, data: dict[str, Any]) -> None:
        """A consumer listener (``consumer.add_listener``): claims and outcomes."""
        name = data.get("name")
        if name is None:
            return
        name = self.label(name)
        if event == "claimed":
            self.claimed.labels(name).inc()
            self.running.labels(name).inc()
            if data.get("queue_wait") is not None:
                self.queue_wait.labels(name).observe(data["queue_wait"])
        elif event == "finished":
            self.finished.labels(name, data["outcome"]).inc()
            self.running.labels(name).dec()
            if data.get("duration") is not None:
                self.duration.labels(name).observe(max(0.0, data["duration"]))

    def on_publisher_event(self, event: str, data: dict[str, Any]) -> None:
        """A publisher listener (``publisher.add_listener``): tasks sent."""
        if event == "sent":
            self.sent.labels(self.label(data["name"]), "created" if data["created"] else "exists").inc()

    # -- the store's gauges ----------------------------------------------------------------------

    async def refresh(self, *, force: bool = False) -> None:
        """Read the store's numbers unless the last read is younger than ``cache_seconds``."""
        if self.operations is None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # concurrent scrapes share one read
            if not force and self._fresh():
                return
            try:
                stats = await self.operations.stats(window=None, statuses=GAUGE_STATUSES)
                workers = await self.operations.list_workers(live=True)
                key_waits = await self.operations.key_waits(limit=MAX_KEYS)
            except MSchedulerError as exc:
                log.warning("metrics: could not read the store: %s", exc)
                self._snapshot, self._store_up = None, 0
                return
            live = sum(1 for w in workers if w.live)
            self._snapshot = _Snapshot(stats, live, self._monotonic(), key_waits)
            self._store_up = 1

    def _fresh(self) -> bool:
        snapshot = self._snapshot
        return snapshot is not None and self._monotonic() - snapshot.taken < self.cache_seconds

    def _refresh_from_thread(self) -> None:
        """On prometheus_client's server thread: have the event loop refresh, and wait."""
        loop = self._loop
        if loop is None or self._fresh() or not loop.is_running():
            return
        if threading.current_thread() is self._loop_thread:
            return  # never block the loop's own thread (callers there use ``await render()``)
        future = asyncio.run_coroutine_threadsafe(self.refresh(), loop)
        try:
            future.result(self.refresh_timeout)
        except Exception as exc:  # a scrape serves what it has: the counters, store_up 0
            future.cancel()
            log.warning("metrics: store read did not finish: %r", exc)
            self._store_up = 0

    def store_metrics(self) -> list[Metric]:
        """The gauges of the last store read (none when it failed or never ran)."""
        up = GaugeMetricFamily(
            "mscheduler_store_up", "1 if the last read of the store for these metrics succeeded."
        )
        up.add_metric([], self._store_up)
        families: list[Metric] = [up]
        snapshot = self._snapshot
        if snapshot is None or self._store_up == 0:
            return families
        tasks = GaugeMetricFamily(
            "mscheduler_tasks",
            "Tasks in the store by name and status (pending, running).",
            labels=["name", "status"],
        )
        oldest = GaugeMetricFamily(
            "mscheduler_oldest_pending_age_seconds",
            "Seconds since the oldest due pending task of a name became due (0: none waiting).",
            labels=["name"],
        )
        # names seen before (in the store or in events) stay, at 0, rather than vanishing; names
        # past MAX_NAMES are summed under OTHER_NAME (their oldest age: the greatest)
        counts: dict[str, dict[str, int]] = {name: {} for name in self._known_names}
        ages: dict[str, float] = {}
        for named in snapshot.stats.names:
            name = self.label(named.name)
            into = counts.setdefault(name, {})
            for status in GAUGE_STATUSES:
                into[status] = into.get(status, 0) + named.counts.get(status, 0)
            ages[name] = max(ages.get(name, 0.0), named.oldest_pending_age or 0.0)
        for name in sorted(counts):
            for status in GAUGE_STATUSES:
                tasks.add_metric([name, status], counts[name].get(status, 0))
            oldest.add_metric([name], ages.get(name, 0.0))
        workers = GaugeMetricFamily("mscheduler_workers_live", "Registered workers with a recent heartbeat.")
        workers.add_metric([], snapshot.live_workers)
        return [*families, tasks, oldest, workers, *self._key_metrics(snapshot.key_waits)]

    @staticmethod
    def _key_metrics(waits: list[KeyWait]) -> list[Metric]:
        """Per fairness key with due tasks (the ``MAX_KEYS`` whose oldest due task waits longest):
        how many are due, and that task's wait."""
        due = GaugeMetricFamily(
            "mscheduler_fair_key_due_tasks",
            f"Due tasks per fairness key (the {MAX_KEYS} keys waiting longest).",
            labels=["fair_key"],
        )
        oldest = GaugeMetricFamily(
            "mscheduler_fair_key_oldest_due_age_seconds",
            "Seconds since the oldest due task of a fairness key became due.",
            labels=["fair_key"],
        )
        for wait in waits:
            due.add_metric([wait.key], wait.due)
            oldest.add_metric([wait.key], wait.oldest_wait)
        return [due, oldest]

    # -- exposing ---------------------------------------------------------------------------------

    async def render(self) -> bytes:
        """The exposition text (refreshing the store's numbers if they are stale)."""
        await self.refresh()
        return generate_latest(self.registry)

    def asgi_app(self) -> ASGIApp:
        """An ASGI app serving the exposition text (mount it at ``/metrics``); each request
        refreshes the store's numbers if they are stale, on the app's event loop."""
        inner = make_asgi_app(self.registry)

        async def app(
            scope: MutableMapping[str, Any],
            receive: Callable[[], Awaitable[Any]],
            send: Callable[[Any], Awaitable[None]],
        ) -> None:
            if scope.get("type") != "http":
                return  # lifespan and websockets: nothing to do
            await self.refresh()
            await inner(scope, receive, send)

        return app

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` with prometheus_client's HTTP server (a daemon thread); call it on
        the running event loop that the store's reads should use. Returns the port (useful with
        ``port=0``). ``close()`` stops it."""
        from prometheus_client import start_http_server

        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.current_thread()
        server, _ = start_http_server(port, addr, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        """Stop the HTTP server of ``serve`` (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class _StoreCollector(Collector):
    """The store's gauges at scrape time (a short cache in ``Metrics``)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # nothing read at registration

    def collect(self) -> Iterable[Metric]:
        self.metrics._refresh_from_thread()
        return self.metrics.store_metrics()


def serve_worker_metrics(
    consumers: Sequence[WorkerSource], port: int, addr: str = "0.0.0.0"
) -> tuple[Metrics, int]:
    """What ``mscheduler worker --metrics-port`` runs (on the worker's event loop, before the
    consumers start): one ``Metrics`` watching every consumer, its store gauges read through the
    first consumer's driver, served on ``addr:port``. Returns it and the port it listens on."""
    metrics = Metrics(Operations(consumers[0].driver) if consumers else None)
    metrics.watch(*consumers)
    return metrics, metrics.serve(port, addr)
