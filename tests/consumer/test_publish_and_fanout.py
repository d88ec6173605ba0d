"""Publishing and running at consumer level: idempotent send, many consumers, fan-out, wait."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from mscheduler import Publisher, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.domain.listing import ListParams
from mscheduler.domain.model import AttemptStatus
from tests.consumer.support import Gate, Harness, settle


async def test_same_key_sent_concurrently_creates_one_task_run_once(harness: Harness) -> None:
    """SPEC F1: ten concurrent sends of one key, from two publishers, create one task."""
    runs: list[Any] = []

    async def work(params: dict[str, Any]) -> int:
        runs.append(params)
        return params["n"]

    # A second publisher on its own connection, as another web server process would have; neither
    # store has been set up by a consumer yet (the publisher is the first to touch it).
    other = Publisher(harness.new_driver(), clock=harness.clock)
    sends = [
        (harness.publisher if i % 2 else other).send(Task("order-1", "work", {"n": i})) for i in range(10)
    ]
    created = await asyncio.gather(*sends)
    assert sorted(created) == [False] * 9 + [True]
    winner = created.index(True)

    consumer = harness.consumer("w1", {"work": work}, concurrency=4)
    await harness.start(consumer)
    await harness.recorder.wait("finished", 1)
    # Re-sending while it runs or after it ended changes nothing and runs nothing.
    assert await harness.publisher.send(Task("order-1", "work", {"n": 99})) is False
    await harness.discover()
    info = await harness.get("order-1")
    assert info.status is TaskStatus.SUCCEEDED
    assert info.params == {"n": winner}
    assert runs == [{"n": winner}]
    assert info.results == [winner]
    assert len(await harness.driver.list_tasks(_all())) == 1


async def test_resend_while_running_does_not_disturb_it(harness: Harness) -> None:
    gate = Gate()

    async def work(params: dict[str, Any]) -> str:
        await gate.wait()
        return "done"

    consumer = harness.consumer("w1", {"work": work})
    await harness.start(consumer)
    assert await harness.publisher.send(Task("k", "work", {"v": 1}))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    before = await harness.get("k")
    for reset in (False, True):
        assert await harness.publisher.send(Task("k", "work", {"v": 2}), reset_finished=reset) is False
    after = await harness.get("k")
    assert after.params == {"v": 1}
    assert after.worker_states == before.worker_states
    gate.open()
    await harness.recorder.wait("finished", 1)
    assert (await harness.get("k")).status is TaskStatus.SUCCEEDED
    assert harness.claims() == ["w1"]


async def test_many_consumers_run_every_task_exactly_once(harness: Harness) -> None:
    """SPEC F2/F12: 4 consumers x 40 tasks, none lost, none run twice."""
    ran: list[tuple[str, str]] = []
    tasks_n, consumers_n = 40, 4

    def make_handler() -> Any:
        async def work(params: dict[str, Any], ctx: TaskContext) -> str:
            await asyncio.sleep(0)  # let other consumers interleave
            ran.append((ctx.key, ctx.worker_id))
            await asyncio.sleep(0)
            return ctx.worker_id

        return work

    first_half = [Task(f"t{i:02d}", "work", {"i": i}) for i in range(tasks_n // 2)]
    second_half = [Task(f"t{i:02d}", "work", {"i": i}) for i in range(tasks_n // 2, tasks_n)]
    assert await harness.publisher.send_many(first_half) == [True] * len(first_half)
    consumers = [
        harness.consumer(f"w{c}", {"work": make_handler()}, concurrency=3) for c in range(consumers_n)
    ]
    await harness.start(*consumers)
    assert await harness.publisher.send_many(second_half) == [True] * len(second_half)
    for _ in range(10):  # the poll timer is the floor where there is no change stream
        if len(harness.finished()) >= tasks_n:
            break
        await harness.advance(1.0)
    await harness.recorder.wait("finished", tasks_n)

    keys = Counter(key for key, _ in ran)
    assert keys == Counter({f"t{i:02d}": 1 for i in range(tasks_n)})
    assert len(harness.claims()) == tasks_n
    assert {outcome for _, d in harness.finished() for outcome in [d["outcome"]]} == {"succeeded"}
    workers_used = {worker for _, worker in ran}
    assert len(workers_used) >= 2, f"one consumer did everything: {Counter(w for _, w in ran)}"
    by_key = dict(ran)
    for doc in await harness.driver.list_tasks(_all()):
        info = await harness.get(doc["key"])
        assert info.status is TaskStatus.SUCCEEDED
        assert [w.status for w in info.worker_states] == [AttemptStatus.SUCCEEDED]
        assert info.worker_states[0].worker_id == by_key[info.key] == info.results[0]
    assert await harness.driver.count_by_status() == {"succeeded": tasks_n}


async def test_concurrent_worker_cnt_three_of_five_consumers(harness: Harness) -> None:
    """SPEC F2: a task meant for 3 workers is run by exactly 3 distinct workers, once each."""
    gate = Gate()

    def make_handler() -> Any:
        async def work(params: dict[str, Any], ctx: TaskContext) -> str:
            await gate.wait()
            return ctx.worker_id

        return work

    option = TaskOption(concurrent_worker_cnt=3)
    assert await harness.publisher.send(Task("fan", "work", {}, option=option))
    consumers = [harness.consumer(f"w{c}", {"work": make_handler()}, concurrency=2) for c in range(5)]
    await harness.start(*consumers)
    await harness.recorder.wait("claimed", 3)
    # Everyone looks again while three hold it: no fourth claim, no worker twice.
    await harness.discover()
    assert gate.waiting == 3
    holders = harness.claims("fan")
    assert len(holders) == 3 and len(set(holders)) == 3
    info = await harness.get("fan")
    assert info.status is TaskStatus.RUNNING and info.running_cnt == 3

    waiter = asyncio.create_task(harness.publisher.wait("fan"))
    gate.open()
    await harness.recorder.wait("finished", 3)
    await harness.discover()  # and again after they succeeded: nothing left to claim
    await harness.advance(1.0)
    assert harness.claims("fan") == holders
    info = await harness.get("fan")
    assert info.status is TaskStatus.SUCCEEDED
    assert info.success_cnt == 3 and info.fail_cnt == 0
    assert sorted(w.worker_id for w in info.worker_states) == sorted(holders)
    assert sorted(await asyncio.wait_for(waiter, 5)) == sorted(holders)


async def test_wait_returns_the_result(harness: Harness) -> None:
    async def work(params: dict[str, Any]) -> dict[str, Any]:
        return {"echo": params}

    consumer = harness.consumer("w1", {"work": work})
    await harness.publisher.send(Task("k", "work", {"x": 1}))
    waiter = asyncio.create_task(harness.publisher.wait("k"))
    await settle()
    assert not waiter.done()
    await harness.start(consumer)
    await harness.recorder.wait("finished", 1)
    await harness.advance(1.0)  # wait() polls on the publisher's clock
    assert await asyncio.wait_for(waiter, 5) == {"echo": {"x": 1}}


async def test_wait_times_out_on_the_fake_clock(harness: Harness) -> None:
    await harness.publisher.send(Task("k", "nobody_handles_this", {}))
    waiter = asyncio.create_task(harness.publisher.wait("k", timeout=5.0))
    await harness.advance(4.0)
    assert not waiter.done()
    await harness.advance(1.5)
    with pytest.raises(TimeoutError, match="still pending"):
        await asyncio.wait_for(waiter, 5)


def _all() -> ListParams:
    return ListParams(limit=1000)
