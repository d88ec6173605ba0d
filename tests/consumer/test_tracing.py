"""OpenTelemetry spans (observability.tracing), with the SDK's in-memory exporter: the attempt's span
is a child of the send's span (the trace context travels in the task document), links the claim
that took the task, carries the outcome; nothing of it changes a task's uniqueness; with tracing
off no span is made and no context stored."""

# mypy: disable-error-code="index"
# (a span's attributes are Optional in opentelemetry's types; these spans were made with them)
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from mscheduler import Fail, Publisher, Task
from mscheduler.observability import tracing as tracing_module
from tests.consumer.support import Harness

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry allows no second), emptied."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
    tracing_module.disable()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def _run_one(harness: Harness, handler: Any, *, key: str = "t1") -> None:
    publisher = Publisher(harness.driver, clock=harness.clock, tracing=True)
    consumer = harness.consumer("w1", {"greet": handler}, tracing=True)
    await harness.start(consumer)
    await publisher.send(Task(key, "greet", {"who": "ada"}))
    await harness.discover(consumer)
    await harness.close()  # the attempt's span has ended once its consumer stopped


async def test_the_handler_span_is_a_child_of_the_send_span(
    harness: Harness, spans: InMemorySpanExporter
) -> None:
    inside: list[Any] = []

    async def greet(params: dict[str, Any]) -> str:
        inside.append(trace.get_current_span().get_span_context())
        return "hello"

    await _run_one(harness, greet)
    [send] = named(spans, "mscheduler send")
    [run] = named(spans, "mscheduler run greet")
    claims = [s for s in named(spans, "mscheduler claim") if s.attributes["mscheduler.claimed"]]
    assert send.kind is SpanKind.PRODUCER and run.kind is SpanKind.CONSUMER
    assert run.context.trace_id == send.context.trace_id
    assert run.parent is not None and run.parent.span_id == send.context.span_id
    assert inside[0].span_id == run.context.span_id  # the handler's own spans nest under it
    assert [link.context.span_id for link in run.links] == [claims[-1].context.span_id]
    assert run.attributes["mscheduler.key"] == "t1"
    assert run.attributes["mscheduler.outcome"] == "succeeded"
    assert run.attributes["mscheduler.worker_id"] == "w1"
    assert run.status.status_code is not StatusCode.ERROR
    assert (await harness.get("t1")).status.value == "succeeded"


async def test_a_failed_attempt_marks_its_span_as_an_error(
    harness: Harness, spans: InMemorySpanExporter
) -> None:
    async def greet(params: dict[str, Any]) -> str:
        raise Fail("no such person")

    await _run_one(harness, greet)
    [run] = named(spans, "mscheduler run greet")
    assert run.attributes["mscheduler.outcome"] == "failed"
    assert run.status.status_code is StatusCode.ERROR
    assert "no such person" in (run.status.description or "")


async def test_the_trace_context_is_stored_apart_from_what_makes_a_task_unique(
    harness: Harness, spans: InMemorySpanExporter
) -> None:
    traced = Publisher(harness.driver, clock=harness.clock, tracing=True)
    plain = Publisher(harness.driver, clock=harness.clock)
    await traced.send(Task("a", "greet", {"n": 1}, unique_by="params"))
    assert not await plain.send(Task("b", "greet", {"n": 1}, unique_by="params"))  # same params
    assert await plain.send(Task("c", "greet", {"n": 2}, unique_by="params"))
    await traced.send_many([Task("d", "greet", {"n": 3}), Task("e", "greet", {"n": 4})])

    docs = {k: await harness.driver.get_task(k) for k in "acde"}
    [one, many] = named(spans, "mscheduler send")
    assert many.attributes["mscheduler.task_count"] == 2
    for key, span in (("a", one), ("d", many), ("e", many)):
        doc = docs[key]
        assert doc is not None
        trace_id = format(span.context.trace_id, "032x")
        assert doc["trace"]["traceparent"].split("-")[1] == trace_id
        assert "trace" not in doc["params"] and "trace" not in doc["option"]
    assert docs["c"] is not None and "trace" not in docs["c"]
    assert (await harness.get("a")).unique_hash is not None


async def test_with_tracing_off_no_span_is_made(harness: Harness, spans: InMemorySpanExporter) -> None:
    publisher = Publisher(harness.driver, clock=harness.clock)
    consumer = harness.consumer("w1", {"greet": _hello})
    assert publisher._tracer is None and consumer._tracer is None
    await harness.start(consumer)
    await publisher.send(Task("t1", "greet", {}))
    await harness.discover(consumer)
    await harness.recorder.wait("finished", 1)
    assert (await harness.get("t1")).status.value == "succeeded"
    assert spans.get_finished_spans() == ()
    doc = await harness.driver.get_task("t1")
    assert doc is not None and "trace" not in doc


async def test_enable_turns_it_on_for_objects_made_afterwards(
    harness: Harness, spans: InMemorySpanExporter
) -> None:
    before = Publisher(harness.driver, clock=harness.clock)
    tracing_module.enable()
    after = Publisher(harness.driver, clock=harness.clock)
    opted_out = Publisher(harness.driver, clock=harness.clock, tracing=False)
    assert before._tracer is None and after._tracer is not None and opted_out._tracer is None


async def _hello(params: Any) -> str:
    return "hello"
