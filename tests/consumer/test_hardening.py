"""Hardening of the consumer and the publisher (issue 6): size caps and results (A5, B4), side
tasks that survive storage errors and stop only on configuration errors (A5 / A6), failures that
are logged (B1), tasks nobody handles (B3), public state and remote stop (B7), and no stray task
exception when a consumer dies mid-ping (B9).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from mscheduler import (
    Consumer,
    ConsumerStopped,
    InvalidInput,
    MemoryDriver,
    Publisher,
    StorageError,
    Task,
    TaskContext,
    TaskFailed,
    TaskOption,
    TaskStatus,
    UnknownTask,
)
from mscheduler.domain.model import AttemptStatus, encoded_size
from mscheduler.operations import Operations
from mscheduler.testing.faults import FaultyDriver, crash_consumer
from tests.consumer.support import FailingDriver, Gate, Harness, settle
from tests.helpers import as_driver, wait_until

CONSUMER_LOG = "mscheduler.consumer"
PUBLISHER_LOG = "mscheduler.publisher"

NO_RETRY_NEEDED = TaskOption(max_unexpected_retries=3, retry_delay=timedelta(seconds=1))
LONG_LEASE = TaskOption(ping_interval=timedelta(seconds=1), worker_timeout=timedelta(minutes=10))


class Order(BaseModel):
    order_id: int


class Receipt(BaseModel):
    order_id: int
    paid_at: datetime
    lines: list[str]


def _records(
    caplog: pytest.LogCaptureFixture, logger: str, level: int | None = None
) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and (level is None or r.levelno == level)]


async def _ok(params: Any) -> str:
    return "ok"


def _blocking(gate: Gate, cancelled: list[str]) -> Any:
    async def work(params: Any, ctx: TaskContext) -> str:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.key)
            raise
        return "done"

    return work


async def _advance_and_discover(harness: Harness, seconds: float, times: int) -> None:
    for _ in range(times):
        await harness.advance(seconds)
        await harness.discover()


# -- A5: size caps ------------------------------------------------------------------------------


async def test_params_over_the_cap_are_refused_at_send_and_nothing_is_written(harness: Harness) -> None:
    at_cap = {"blob": "x" * 100}
    cap = encoded_size(at_cap)
    publisher = Publisher(harness.driver, clock=harness.clock, max_params_bytes=cap)
    assert await publisher.send(Task("fits", "work", at_cap)), "exactly at the cap is accepted"
    too_big = {"blob": "x" * 101}
    with pytest.raises(InvalidInput, match=r"'big'.*max_params_bytes"):
        await publisher.send(Task("big", "work", too_big))
    with pytest.raises(UnknownTask):
        await harness.get("big")
    with pytest.raises(InvalidInput, match=r"'big2'"):
        await publisher.send_many([Task("small", "work", {"n": 1}), Task("big2", "work", too_big)])
    for key in ("small", "big2"):
        with pytest.raises(UnknownTask):
            await harness.get(key)
    for bad in (0, -1, 9 * 1024 * 1024):
        with pytest.raises(InvalidInput):
            Publisher(harness.driver, max_params_bytes=bad)


def test_max_result_bytes_is_checked() -> None:
    for bad in (0, 16 * 1024 * 1024):
        with pytest.raises(InvalidInput):
            Consumer(MemoryDriver(), max_result_bytes=bad)


async def test_a_result_over_the_cap_fails_the_task_at_once_and_the_consumer_runs_on(
    harness: Harness,
) -> None:
    calls: list[str] = []

    async def big(params: Any, ctx: TaskContext) -> str:
        calls.append(ctx.key)
        return "x" * 500

    consumer = harness.consumer("w1", {"big": big, "small": _ok}, max_result_bytes=200)
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "big", {}, option=NO_RETRY_NEEDED))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    info = await harness.get("t")
    assert info.status is TaskStatus.FAILED
    assert [w.status for w in info.worker_states] == [AttemptStatus.REJECTED]
    assert info.worker_states[0].result is None
    error = info.last_error
    assert error is not None and error.type == "ResultTooLarge"
    assert "max_result_bytes" in error.message and "200" in error.message
    await _advance_and_discover(harness, 2.0, 3)
    assert calls == ["t"], "no retry: the same handler gives the same result"
    assert consumer.state == "running" and consumer.error is None

    await harness.publisher.send(Task("next", "small", {}))
    await harness.discover()
    await harness.recorder.wait("finished", 2)
    assert (await harness.get("next")).results == ["ok"]
    with pytest.raises(TaskFailed, match="ResultTooLarge"):
        await asyncio.wait_for(harness.publisher.wait("t"), 5)


UNSTORABLE = {
    "set": lambda: {1, 2},
    "object": lambda: object(),
    "nested-set": lambda: {"a": [1, {2}]},
    "operator-key": lambda: {"$where": 1},
}


@pytest.mark.parametrize("make_result", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
async def test_a_result_that_cannot_be_stored_fails_without_retry(harness: Harness, make_result: Any) -> None:
    calls: list[int] = []

    async def odd(params: Any, ctx: TaskContext) -> Any:
        calls.append(ctx.attempt_no)
        return make_result()

    consumer = harness.consumer("w1", {"odd": odd, "small": _ok})
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "odd", {}, option=NO_RETRY_NEEDED))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    info = await harness.get("t")
    assert info.status is TaskStatus.FAILED
    assert [w.status for w in info.worker_states] == [AttemptStatus.REJECTED]
    error = info.last_error
    assert error is not None and error.type == "ResultNotStorable"
    assert "result" in error.message
    await _advance_and_discover(harness, 2.0, 3)
    assert calls == [1]
    assert consumer.state == "running"
    await harness.publisher.send(Task("next", "small", {}))
    await harness.discover()
    await harness.recorder.wait("finished", 2)


async def test_an_unstorable_result_message_does_not_speak_of_params(harness: Harness) -> None:
    async def odd(params: Any) -> Any:
        return {"a": {1, 2}}

    consumer = harness.consumer("w1", {"odd": odd})
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "odd", {}))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    error = (await harness.get("t")).last_error
    assert error is not None and error.type == "ResultNotStorable"
    assert "result" in error.message
    assert "params" not in error.message, error.message


async def test_a_pydantic_model_result_is_stored_as_its_json_dump(harness: Harness) -> None:
    receipt = Receipt(order_id=7, paid_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC), lines=["a", "b"])

    async def pay(order: Order) -> Receipt:
        return receipt.model_copy(update={"order_id": order.order_id})

    consumer = harness.consumer("w1", {"pay": pay})
    await harness.start(consumer)
    await harness.publisher.send(Task("r", "pay", {"order_id": 7}))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    result = await asyncio.wait_for(harness.publisher.wait("r"), 5)
    assert result == receipt.model_dump(mode="json")
    assert isinstance(result, dict) and isinstance(result["paid_at"], str)


# -- A5 / A6: side tasks survive storage errors; configuration errors stop the consumer loudly ------


async def test_a_configuration_error_in_the_heartbeat_stops_the_consumer_loudly(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=CONSUMER_LOG)
    faulty = FaultyDriver(harness.new_driver())
    consumer = harness.consumer("A", {"work": _ok}, driver=as_driver(faulty), heartbeat_interval=5.0)
    await harness.start(consumer)
    run = asyncio.create_task(consumer.run())
    error = StorageError("heartbeat failed (configuration): not authorized", config=True)
    faulty.fail_next("heartbeat_worker", error=error)
    await harness.advance(5.0)
    with pytest.raises(ConsumerStopped):
        await asyncio.wait_for(run, 5)
    assert consumer.state == "stopped"
    assert consumer.stop_reason is not None and consumer.stop_reason.startswith("error:")
    assert "not authorized" in consumer.stop_reason
    assert consumer.error is error
    assert any(
        "heartbeat" in r.getMessage() and getattr(r, "side_task", "").endswith(":heartbeat")
        for r in _records(caplog, CONSUMER_LOG, logging.ERROR)
    ), "a configuration error is logged at ERROR with the reason"


async def test_a_configuration_error_in_the_pinger_stops_the_consumer_and_releases_its_handlers(
    harness: Harness,
) -> None:
    gate, cancelled = Gate(), list[str]()
    faulty = FaultyDriver(harness.new_driver())
    consumer = harness.consumer("A", {"work": _blocking(gate, cancelled)}, driver=as_driver(faulty))
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "work", {}, option=LONG_LEASE))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    run = asyncio.create_task(consumer.run())
    faulty.fail_next("ping", error=StorageError("UnknownReplWriteConcern", config=True))
    await harness.advance(1.0)  # the ping interval
    with pytest.raises(ConsumerStopped):
        await asyncio.wait_for(run, 5)
    assert faulty.calls["ping"] == 1
    assert consumer.state == "stopped"
    assert consumer.stop_reason == "error: UnknownReplWriteConcern"
    assert cancelled == ["t"]
    info = await harness.get("t")
    assert [w.status for w in info.worker_states] == [AttemptStatus.RELEASED]
    assert info.fail_cnt == 0


async def test_permanent_errors_in_the_pinger_and_heartbeat_do_not_stop_the_consumer(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=CONSUMER_LOG)
    gate, cancelled = Gate(), list[str]()
    faulty = FaultyDriver(harness.new_driver())
    consumer = harness.consumer(
        "A", {"work": _blocking(gate, cancelled)}, driver=as_driver(faulty), heartbeat_interval=5.0
    )
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "work", {}, option=LONG_LEASE))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    odd = StorageError("BadValue: something odd", transient=False)
    faulty.fail_next("ping", error=odd, times=3)
    faulty.fail_next("heartbeat_worker", error=odd, times=2)
    for _ in range(12):
        await harness.advance(1.0)
    assert faulty.calls["ping"] >= 5 and faulty.calls["heartbeat_worker"] >= 2
    assert faulty.injected[("ping", "before")] == 3
    assert faulty.injected[("heartbeat_worker", "before")] == 2
    assert consumer.state == "running" and consumer.error is None and consumer.stop_reason is None
    assert cancelled == [], "a lease far from its end is kept through failed pings"
    operations = {getattr(r, "operation", None) for r in _records(caplog, CONSUMER_LOG, logging.ERROR)}
    assert {"ping", "heartbeat"} <= operations, "each error is logged at ERROR"
    gate.open()
    await harness.recorder.wait("finished", 1)
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED
    # the heartbeat still works: a remote stop is seen
    assert await Operations(harness.driver, clock=harness.clock).request_worker_stop("A")
    await harness.advance(5.0)
    await harness.recorder.wait("stopped", 1)
    assert (consumer.state, consumer.stop_reason) == ("stopped", "remote")  # type: ignore[comparison-overlap]


# -- B1: failures are logged ----------------------------------------------------------------------


async def test_failed_attempts_are_logged_with_structured_fields(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=CONSUMER_LOG)

    async def boom(params: Any, ctx: TaskContext) -> None:
        raise RuntimeError(f"boom {ctx.attempt_no}")

    option = TaskOption(max_unexpected_retries=1, retry_delay=timedelta(seconds=1))
    consumer = harness.consumer("w1", {"boom": boom})
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "boom", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("finished", 1)

    (first,) = [r for r in _records(caplog, CONSUMER_LOG) if getattr(r, "error_type", None)]
    assert first.levelno == logging.INFO
    fields = {f: getattr(first, f) for f in ("key", "task_name", "attempt_no", "worker_id")}
    assert fields == {"key": "t", "task_name": "boom", "attempt_no": 1, "worker_id": "w1"}
    assert (first.error_type, first.error_message) == ("RuntimeError", "boom 1")  # type: ignore[attr-defined]
    assert "boom 1" in first.getMessage()

    await harness.advance(1.0)  # the retry delay: the attempt that uses up the budget
    await harness.recorder.wait("finished", 2)
    assert (await harness.get("t")).status is TaskStatus.FAILED
    last = [r for r in _records(caplog, CONSUMER_LOG) if getattr(r, "error_type", None)][-1]
    assert last.levelno == logging.WARNING
    assert (last.key, last.attempt_no, last.error_message) == ("t", 2, "boom 2")  # type: ignore[attr-defined]
    message = last.getMessage()
    assert "Traceback (most recent call last)" in message and "RuntimeError: boom 2" in message
    assert "in boom" in message, "the traceback names the handler's frame"


async def test_a_lost_lease_is_logged_at_warning(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=CONSUMER_LOG)
    gate, cancelled = Gate(), list[str]()
    failing = FailingDriver(harness.new_driver())
    consumer = harness.consumer("w1", {"work": _blocking(gate, cancelled)}, driver=failing)
    await harness.start(consumer)
    option = TaskOption(ping_interval=timedelta(seconds=1), worker_timeout=timedelta(seconds=2))
    await harness.publisher.send(Task("t", "work", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    failing.fail["ping"] = StorageError("connection reset", transient=True)
    for _ in range(8):
        if cancelled:
            break
        await harness.advance(0.5)
    await harness.recorder.wait("lost", 1)
    assert cancelled == ["t"]
    (record,) = [r for r in _records(caplog, CONSUMER_LOG) if getattr(r, "reason", None) == "lost"]
    assert record.levelno == logging.WARNING
    assert (record.key, record.worker_id, record.task_name) == ("t", "w1", "work")  # type: ignore[attr-defined]
    assert "lost" in record.getMessage()


async def test_rejected_params_are_logged_at_warning(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=CONSUMER_LOG)

    async def place(order: Order) -> None:
        return None

    consumer = harness.consumer("w1", {"place": place})
    await harness.start(consumer)
    await harness.publisher.send(Task("bad", "place", {"order_id": "not a number"}))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    (record,) = [r for r in _records(caplog, CONSUMER_LOG) if getattr(r, "error_type", None)]
    assert record.levelno == logging.WARNING
    assert (record.key, record.error_type, record.outcome) == ("bad", "InvalidParams", "rejected")  # type: ignore[attr-defined]
    assert "order_id" in record.getMessage()


# -- B3: tasks nobody handles ---------------------------------------------------------------------


async def test_the_publisher_warns_once_per_name_that_no_live_worker_handles(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=PUBLISHER_LOG)
    await harness.publisher.send(Task("a1", "orphan"))
    await harness.publisher.send(Task("a2", "orphan"))
    await harness.publisher.send_many([Task("b1", "other"), Task("b2", "other"), Task("a3", "orphan")])
    records = _records(caplog, PUBLISHER_LOG, logging.WARNING)
    assert [r.task_name for r in records] == ["orphan", "other"]  # type: ignore[attr-defined]
    assert "no live worker handles tasks named 'orphan'" in records[0].getMessage()


async def test_no_warning_for_a_name_that_a_live_worker_handles(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=PUBLISHER_LOG)
    consumer = harness.consumer("w1", {"work": _ok})
    await harness.start(consumer)
    await harness.publisher.send(Task("t1", "work"))
    await harness.publisher.send_many([Task("t2", "work")])
    assert _records(caplog, PUBLISHER_LOG) == []
    await consumer.stop()
    # a stopped worker is not live: a fresh publisher warns about the name again
    await Publisher(harness.driver, clock=harness.clock).send(Task("t3", "work"))
    assert [r.task_name for r in _records(caplog, PUBLISHER_LOG, logging.WARNING)] == ["work"]  # type: ignore[attr-defined]


async def test_wait_timeout_says_when_no_live_worker_handles_the_name(harness: Harness) -> None:
    await harness.publisher.send(Task("t", "orphan"))
    with pytest.raises(TimeoutError, match="no live worker handles tasks named 'orphan'"):
        await harness.publisher.wait("t", timeout=0)
    waiting = asyncio.create_task(harness.publisher.wait("t", timeout=1.0))
    for _ in range(20):
        if waiting.done():
            break
        await harness.advance(0.25)
    with pytest.raises(TimeoutError, match=r"still pending after 1.0s; no live worker handles"):
        await asyncio.wait_for(waiting, 5)

    # handled by a live worker but not due yet: the timeout says nothing of workers
    consumer = harness.consumer("w1", {"later": _ok})
    await harness.start(consumer)
    run_at = harness.clock.now() + timedelta(hours=1)
    await harness.publisher.send(Task("l", "later", option=TaskOption(run_at=run_at)))
    with pytest.raises(TimeoutError) as caught:
        await harness.publisher.wait("l", timeout=0)
    assert "no live worker" not in str(caught.value)


# -- B7: public state and remote stop -------------------------------------------------------------


async def test_consumer_state_goes_created_running_stopping_stopped(harness: Harness) -> None:
    gate, cancelled = Gate(), list[str]()
    consumer = harness.consumer("w1", {"work": _blocking(gate, cancelled)})
    assert (consumer.state, consumer.stop_reason) == ("created", None)
    await harness.start(consumer)
    assert (consumer.state, consumer.stop_reason) == ("running", None)
    await harness.publisher.send(Task("t", "work", {}, option=LONG_LEASE))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    stopping = asyncio.create_task(consumer.stop(grace=30.0))
    await wait_until(lambda: consumer.state == "stopping", what="the consumer to be stopping")
    assert consumer.stop_reason == "requested"
    gate.open()
    await asyncio.wait_for(stopping, 5)
    assert (consumer.state, consumer.stop_reason, consumer.error) == ("stopped", "requested", None)
    assert cancelled == []
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED


async def test_operations_list_workers_and_stop_one_remotely(harness: Harness) -> None:
    operations = Operations(harness.driver, clock=harness.clock)
    a = harness.consumer("A", {"work": _ok}, heartbeat_interval=5.0)
    b = harness.consumer("B", {"work": _ok, "other": _ok}, heartbeat_interval=5.0, groups=["gpu"])
    await harness.start(a, b)
    views = {v.worker_id: v for v in await operations.list_workers()}
    assert set(views) == {"A", "B"}
    assert views["A"].live and not views["A"].stop_requested and views["A"].stop_time is None
    assert views["B"].names == ("other", "work")
    assert (views["A"].groups, views["B"].groups) == ((), ("gpu",))

    assert await operations.request_worker_stop("A")
    assert not await operations.request_worker_stop("nobody")
    for bad in ("$gt", "", 42):
        with pytest.raises(InvalidInput):
            await operations.request_worker_stop(bad)  # type: ignore[arg-type]
    assert {v.worker_id: v.stop_requested for v in await operations.list_workers()} == {"A": True, "B": False}
    await harness.advance(4.0)
    assert a.state == "running", "seen at the next heartbeat, not before"
    await harness.advance(1.0)
    await harness.recorder.wait("stopped", 1)
    await asyncio.wait_for(a.wait_stopped(), 5)
    assert (a.state, a.stop_reason, a.error) == ("stopped", "remote", None)
    assert b.state == "running"
    views = {v.worker_id: v for v in await operations.list_workers()}
    assert not views["A"].live and views["A"].stop_time is not None
    assert views["B"].live
    assert not await operations.request_worker_stop("A"), "stopped already"


async def test_operations_list_and_count_tasks(harness: Harness) -> None:
    operations = Operations(harness.driver, clock=harness.clock)
    assert await operations.count_by_status() == {
        "pending": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "expired": 0,
        "cancelled": 0,
    }
    await harness.publisher.send_many([Task("x1", "x"), Task("x2", "x"), Task("y1", "y")])
    consumer = harness.consumer("w1", {"y": _ok})
    await harness.start(consumer)
    await harness.recorder.wait("finished", 1)

    with pytest.raises(InvalidInput, match="status"):
        await operations.list_tasks(status="nope")
    for bad in ({"limit": 0}, {"name": "bad name!"}):
        with pytest.raises(InvalidInput):
            await operations.list_tasks(**bad)
    assert [t.key for t in await operations.list_tasks(name="x", status="pending")] == ["x1", "x2"]
    assert [t.key for t in await operations.list_tasks(name="x", status="succeeded")] == []
    assert [t.key for t in await operations.list_tasks(status="succeeded")] == ["y1"]
    assert [t.key for t in await operations.list_tasks(limit=2)] == ["x1", "x2"]
    assert await operations.count_by_status() == {
        "pending": 2,
        "running": 0,
        "succeeded": 1,
        "failed": 0,
        "expired": 0,
        "cancelled": 0,
    }
    assert (await operations.get_task("y1")).results == ["ok"]
    with pytest.raises(UnknownTask):
        await operations.get_task("nope")


# -- B9: no stray task exception when a consumer dies with a ping in flight -------------------------


@contextmanager
def _records_keep_nothing_alive() -> Iterator[None]:
    """Captured log records keep their arguments until the test ends, and an exception among them
    keeps its traceback's frames (the consumer, its side tasks, the ping task...) alive: format
    each record at once, so that garbage collection sees what a process without pytest would."""

    def flatten(record: logging.LogRecord) -> bool:
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return True

    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(flatten)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(flatten)


@pytest.mark.parametrize("how", ["crash-frozen", "stop-slow-ping"])
async def test_a_consumer_killed_mid_ping_leaves_no_unretrieved_exception(
    harness: Harness, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    with _records_keep_nothing_alive():
        await _kill_mid_ping(harness, how)
        for _ in range(3):
            gc.collect()
            await settle(20)
        gc.collect()
    stray = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert stray == []


async def _kill_mid_ping(harness: Harness, how: str) -> None:
    gate, cancelled = Gate(), list[str]()
    faulty = FaultyDriver(harness.new_driver())
    # Built by hand, not through the harness: a crashed consumer must not be stopped again.
    consumer = Consumer(as_driver(faulty), worker_id="A", clock=harness.clock, poll_interval=1.0)
    consumer.register("work", _blocking(gate, cancelled))
    harness.recorder.attach(consumer)
    await consumer.start()
    await harness.publisher.send(Task("t", "work", {}, option=LONG_LEASE))
    await harness.discover(consumer)
    await harness.recorder.wait("claimed", 1)
    if how == "crash-frozen":
        faulty.freeze()
    else:
        faulty.set_latency(3600.0, "ping")  # real seconds: the reply never comes in this test
    await harness.advance(1.0)  # the ping interval: the ping is sent and hangs
    assert faulty.calls["ping"] == 1
    if how == "crash-frozen":
        await crash_consumer(consumer)
    else:
        await asyncio.wait_for(consumer.stop(grace=0), 5)
        assert consumer.state == "stopped"
    assert cancelled == ["t"]
