"""Prometheus metrics (SPEC G3): counters and histograms move as a consumer runs tasks, gauges
show the store (read at most once per cache period), and ``serve`` answers over HTTP."""

from __future__ import annotations

import asyncio
import urllib.request
from datetime import timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mscheduler import Operations, Task, TaskOption
from mscheduler.observability.metrics import Metrics
from tests.consumer.support import Gate, Harness, WrappedDriver, settle


def samples(text: bytes | str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text: (name, sorted labels) -> value."""
    if isinstance(text, bytes):
        text = text.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, **labels: str) -> float:
    return found.get((metric, tuple(sorted(labels.items()))), 0.0)


class CountingDriver(WrappedDriver):
    """Counts the store reads of the metrics' gauges."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.stats_reads = 0

    async def task_stats(self, params: Any, on_step: Any = None) -> Any:
        self.stats_reads += 1
        return await self.inner.task_stats(params, on_step)


async def test_counters_and_histograms_follow_the_consumer(harness: Harness) -> None:
    gate = Gate()

    async def slow(params: Any) -> str:
        await gate.wait()
        return "done"

    async def boom(params: Any) -> None:
        raise RuntimeError("boom")

    metrics = Metrics()
    metrics.watch(harness.publisher)
    consumer = harness.consumer("w1", {"slow": slow, "boom": boom}, concurrency=2)
    metrics.watch(consumer)

    await harness.start(consumer)
    due = TaskOption(run_at=harness.clock.now() - timedelta(seconds=2))  # due 2 s before the claim
    assert await harness.publisher.send(Task("s1", "slow", {}, option=due))
    assert not await harness.publisher.send(Task("s1", "slow", {}))  # exists
    once = due.model_copy(update={"max_unexpected_retries": 0})
    await harness.publisher.send(Task("b1", "boom", {}, option=once))
    await harness.discover(consumer)
    await harness.recorder.wait("claimed", 2)
    running = samples(await metrics.render())
    assert value(running, "mscheduler_attempts_running", name="slow") == 1
    await harness.advance(3)  # the slow handler runs 3 s on the fake clock
    gate.open()
    await harness.recorder.wait("finished", 2)

    found = samples(await metrics.render())
    assert value(found, "mscheduler_tasks_sent_total", name="slow", result="created") == 1
    assert value(found, "mscheduler_tasks_sent_total", name="slow", result="exists") == 1
    assert value(found, "mscheduler_tasks_sent_total", name="boom", result="created") == 1
    assert value(found, "mscheduler_attempts_claimed_total", name="slow") == 1
    assert value(found, "mscheduler_attempts_finished_total", name="slow", outcome="succeeded") == 1
    assert value(found, "mscheduler_attempts_finished_total", name="boom", outcome="failed") == 1
    assert value(found, "mscheduler_attempts_running", name="slow") == 0
    assert value(found, "mscheduler_attempt_duration_seconds_count", name="slow") == 1
    assert value(found, "mscheduler_attempt_duration_seconds_sum", name="slow") == 3.0
    assert value(found, "mscheduler_attempt_duration_seconds_bucket", name="slow", le="2.5") == 0
    assert value(found, "mscheduler_attempt_duration_seconds_bucket", name="slow", le="5.0") == 1
    assert value(found, "mscheduler_queue_wait_seconds_sum", name="slow") == 2.0
    assert value(found, "mscheduler_queue_wait_seconds_count", name="boom") == 1
    assert ("mscheduler_store_up", ()) not in found  # no Operations: no store gauges


async def test_gauges_show_the_store_and_are_cached(harness: Harness) -> None:
    driver = CountingDriver(harness.driver)
    metrics = Metrics(Operations(driver, clock=harness.clock), clock=harness.clock, cache_seconds=5)

    async def other(params: Any) -> None:
        return None

    consumer = harness.consumer("w1", {"other": other})
    await harness.start(consumer)
    for key in ("i1", "i2"):
        await harness.publisher.send(Task(key, "idle", {}, option=TaskOption(fair_key="acme")))
    later = TaskOption(run_at=harness.clock.now() + timedelta(minutes=10))  # pending, not due
    await harness.publisher.send(Task("later", "idle", {}, option=later))
    await harness.advance(10)

    found = samples(await metrics.render())
    assert value(found, "mscheduler_store_up") == 1
    assert value(found, "mscheduler_tasks", name="idle", status="pending") == 3
    assert value(found, "mscheduler_tasks", name="idle", status="running") == 0
    assert value(found, "mscheduler_oldest_pending_age_seconds", name="idle") == 10.0
    assert value(found, "mscheduler_workers_live") == 1
    assert value(found, "mscheduler_fair_key_due_tasks", fair_key="acme") == 2
    assert value(found, "mscheduler_fair_key_oldest_due_age_seconds", fair_key="acme") == 10.0
    assert driver.stats_reads == 1

    await harness.publisher.send(Task("i3", "idle", {}))
    cached = samples(await metrics.render())  # within cache_seconds: the same read
    assert value(cached, "mscheduler_tasks", name="idle", status="pending") == 3
    assert driver.stats_reads == 1
    await harness.advance(5)
    fresh = samples(await metrics.render())
    assert value(fresh, "mscheduler_tasks", name="idle", status="pending") == 4
    assert value(fresh, "mscheduler_oldest_pending_age_seconds", name="idle") == 15.0
    assert driver.stats_reads == 2


async def test_serve_answers_on_http_and_reads_the_store_on_the_loop(harness: Harness) -> None:
    metrics = Metrics(Operations(harness.driver, clock=harness.clock), clock=harness.clock)
    await harness.publisher.send(Task("i1", "idle", {}))
    port = metrics.serve(0, "127.0.0.1")
    try:

        def scrape() -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                return bytes(reply.read())

        # the scrape runs on the server's thread; the store is read on this loop meanwhile
        text = await asyncio.to_thread(scrape)
    finally:
        metrics.close()
        metrics.close()  # idempotent
    await settle()
    found = samples(text)
    assert value(found, "mscheduler_store_up") == 1
    assert value(found, "mscheduler_tasks", name="idle", status="pending") == 1


async def test_the_asgi_app_serves_the_text(harness: Harness) -> None:
    metrics = Metrics(Operations(harness.driver, clock=harness.clock), clock=harness.clock)
    await harness.publisher.send(Task("i1", "idle", {}))
    app = metrics.asgi_app()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "query_string": b"", "headers": []}
    await app(scope, receive, send)
    assert sent[0]["status"] == 200
    found = samples(sent[1]["body"])
    assert value(found, "mscheduler_tasks", name="idle", status="pending") == 1
