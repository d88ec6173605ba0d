"""Retry budget (SPEC F3), typed params (SPEC G4) and bad input at the consumer."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from mscheduler import (
    Consumer,
    InvalidInput,
    MemoryDriver,
    Task,
    TaskContext,
    TaskFailed,
    TaskOption,
    TaskStatus,
)
from mscheduler.domain.model import AttemptStatus
from tests.consumer.support import Harness


class Order(BaseModel):
    order_id: int
    note: str = ""


async def test_failing_handler_uses_its_budget_then_fails_for_good(harness: Harness) -> None:
    attempts: list[int] = []

    async def boom(params: Any, ctx: TaskContext) -> None:
        attempts.append(ctx.attempt_no)
        raise RuntimeError(f"boom {ctx.attempt_no}")

    option = TaskOption(max_unexpected_retries=2, retry_delay=timedelta(seconds=5))
    consumer = harness.consumer("w1", {"boom": boom})
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "boom", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    assert attempts == [1]
    info = await harness.get("t")
    assert info.status is TaskStatus.PENDING and info.fail_cnt == 1
    assert info.worker_states[0].retry_at == info.worker_states[0].end_time + timedelta(seconds=5)  # type: ignore[operator]

    for n in (2, 3):
        await harness.advance(4.0)  # polls run, nothing is due yet
        await harness.discover()
        assert attempts == list(range(1, n)), "claimed before retry_delay passed"
        await harness.advance(1.0)
        await harness.recorder.wait("finished", n)
        assert attempts == list(range(1, n + 1))

    info = await harness.get("t")
    assert info.status is TaskStatus.FAILED
    assert info.fail_cnt == 3
    assert [w.status for w in info.worker_states] == [AttemptStatus.FAILED] * 3
    assert info.last_error is not None
    assert info.last_error.type == "RuntimeError" and info.last_error.message == "boom 3"
    assert "RuntimeError: boom 3" in (info.last_error.traceback or "")

    for _ in range(3):  # the budget is used: never claimed again
        await harness.advance(10.0)
        await harness.discover()
    assert attempts == [1, 2, 3]
    with pytest.raises(TaskFailed) as caught:
        await asyncio.wait_for(harness.publisher.wait("t"), 5)
    assert caught.value.error is not None
    assert caught.value.error["type"] == "RuntimeError"
    assert caught.value.error["message"] == "boom 3"
    assert "boom 3" in str(caught.value)


async def test_handler_gets_a_pydantic_model_instance(harness: Harness) -> None:
    seen: list[Any] = []

    async def place(order: Order, ctx: TaskContext) -> int:
        seen.append(order)
        return order.order_id * 2

    consumer = harness.consumer("w1", {"place": place})
    await harness.publisher.send(Task("o1", "place", Order(order_id=21, note="x")))
    await harness.publisher.send(Task("o2", "place", {"order_id": "7"}))  # pydantic coerces "7"
    await harness.start(consumer)
    await harness.recorder.wait("finished", 2)
    assert all(isinstance(o, Order) for o in seen)
    assert sorted(o.order_id for o in seen) == [7, 21]
    assert (await harness.get("o1")).results == [42]
    assert (await harness.get("o2")).results == [14]


async def test_invalid_params_fail_the_task_at_once_without_retries(harness: Harness) -> None:
    ran: list[Any] = []

    async def place(order: Order) -> None:
        ran.append(order)

    option = TaskOption(max_unexpected_retries=5, retry_delay=timedelta(seconds=1))
    consumer = harness.consumer("w1", {"place": place})
    await harness.publisher.send(Task("bad", "place", {"order_id": "not a number"}, option=option))
    await harness.start(consumer)
    await harness.recorder.wait("finished", 1)
    assert ran == []
    info = await harness.get("bad")
    assert info.status is TaskStatus.FAILED
    assert [w.status for w in info.worker_states] == [AttemptStatus.REJECTED]
    error = info.last_error
    assert error is not None and error.type == "InvalidParams"
    assert "order_id" in error.message
    for _ in range(3):
        await harness.advance(2.0)
        await harness.discover()
    assert harness.claims("bad") == ["w1"]
    with pytest.raises(TaskFailed, match="InvalidParams"):
        await asyncio.wait_for(harness.publisher.wait("bad"), 5)


async def test_unknown_task_names_are_never_claimed(harness: Harness) -> None:
    async def known(params: Any) -> str:
        return "ok"

    consumer = harness.consumer("w1", {"known": known}, concurrency=4)
    await harness.publisher.send(Task("stranger", "unknown_name", {}))
    await harness.start(consumer)
    await harness.publisher.send(Task("friend", "known", {}))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    for _ in range(3):
        await harness.advance(1.0)
        await harness.discover()
    assert harness.claims() == ["w1"]
    assert harness.recorder.of("claimed")[0][1]["key"] == "friend"
    info = await harness.get("stranger")
    assert info.status is TaskStatus.PENDING and info.worker_states == []


async def _handler(params: Any) -> None:
    return None


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda d: Consumer(d, concurrency=0), id="concurrency-0"),
        pytest.param(lambda d: Consumer(d, concurrency=-1), id="concurrency-negative"),
        pytest.param(lambda d: Consumer(d, poll_interval=0), id="poll-interval-0"),
        pytest.param(lambda d: Consumer(d, grace_period=-1), id="grace-negative"),
        pytest.param(lambda d: Consumer(d, claim_lease=timedelta(0)), id="claim-lease-0"),
        pytest.param(lambda d: Consumer(d, worker_id="$where"), id="worker-id-operator"),
        pytest.param(lambda d: Consumer(d).register("bad name!", _handler), id="bad-task-name"),
        pytest.param(lambda d: Consumer(d).register("job", 42), id="not-a-callable"),  # type: ignore[arg-type]
        pytest.param(
            lambda d: Consumer(d).register("lam", lambda p: None, run_in="process"), id="lambda-in-a-process"
        ),
        pytest.param(lambda d: _twice(Consumer(d)), id="same-name-twice"),
    ],
)
def test_bad_consumer_config_is_refused(build: Any) -> None:
    with pytest.raises(InvalidInput):
        build(MemoryDriver())


def _twice(consumer: Consumer) -> None:
    consumer.register("dup", _handler)
    consumer.register("dup", _handler)


async def test_starting_without_handlers_is_refused() -> None:
    consumer = Consumer(MemoryDriver())
    with pytest.raises(InvalidInput):
        await consumer.start()
    assert consumer.running_count == 0
