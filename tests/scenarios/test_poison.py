"""Poison input: params that the handler's pydantic model refuses fail the task at once, with the
reason, and are never retried; a handler that raises is retried until the budget is used."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskOption, TaskStatus
from tests.helpers import Recorder
from tests.scenarios.harness import advance, advance_until

OPTION = TaskOption(
    ping_interval=timedelta(seconds=1),
    worker_timeout=timedelta(seconds=5),
    retry_delay=timedelta(seconds=1),
    max_unexpected_retries=3,
)


class Order(BaseModel):
    order_id: int
    amount: float


async def test_params_the_model_refuses_fail_the_task_at_once(make_driver, fake_clock: FakeClock) -> None:
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    consumer = Consumer(store, worker_id="A", clock=fake_clock, poll_interval=1.0)
    calls: list[Order] = []

    @consumer.handler("order")
    async def handle(params: Order) -> str:
        calls.append(params)
        return "ok"

    recorder = Recorder(consumer)
    await publisher.send(Task("bad", "order", {"order_id": "not a number"}, option=OPTION))
    await publisher.send(Task("good", "order", {"order_id": 7, "amount": 1.5}, option=OPTION))
    async with consumer:
        await advance_until(fake_clock, lambda: recorder.counts["finished"] >= 2, limit=10)
        await advance(fake_clock, 10 * OPTION.retry_delay.total_seconds())  # no retry comes
    assert recorder.counts["claimed"] == 2

    bad = await publisher.get("bad")
    assert bad.status is TaskStatus.FAILED
    assert [w.status.value for w in bad.worker_states] == ["rejected"], "no retries"
    assert bad.last_error is not None
    assert bad.last_error.type == "InvalidParams"
    assert "order_id" in bad.last_error.message and "amount" in bad.last_error.message
    assert [c.order_id for c in calls] == [7], "the handler never saw the bad params"
    assert (await publisher.get("good")).status is TaskStatus.SUCCEEDED


async def test_a_failing_handler_is_retried_until_the_budget_is_used(
    make_driver, fake_clock: FakeClock
) -> None:
    """Contrast: an exception is not poison; it is retried max_unexpected_retries times, reason kept."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    consumer = Consumer(store, worker_id="A", clock=fake_clock, poll_interval=1.0)
    calls: list[Any] = []

    @consumer.handler("flaky")
    async def handle(params: Any) -> None:
        calls.append(params)
        raise RuntimeError(f"boom {len(calls)}")

    await publisher.send(Task("t1", "flaky", {"x": 1}, option=OPTION))

    async def failed() -> bool:
        return (await publisher.get("t1")).status is TaskStatus.FAILED

    async with consumer:
        await advance_until(fake_clock, failed, limit=60)
        await advance(fake_clock, 10.0)
    info = await publisher.get("t1")
    assert [w.status.value for w in info.worker_states] == ["failed"] * 4
    assert len(calls) == 4
    assert info.last_error is not None and info.last_error.message == "boom 4"
    assert info.last_error.traceback is not None and "RuntimeError" in info.last_error.traceback
    gaps = [
        (later.start_time - earlier.end_time).total_seconds()
        for earlier, later in zip(info.worker_states, info.worker_states[1:], strict=False)
        if earlier.end_time is not None
    ]
    assert all(gap >= OPTION.retry_delay.total_seconds() for gap in gaps), gaps
