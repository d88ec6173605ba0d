"""Groups (SPEC F31) and dispatch counts (SPEC F33) as consumers see them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mscheduler import Consumer, InvalidInput, OptionChange, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.domain.model import AttemptStatus
from tests.consumer.support import Gate, Harness


def _handler(gate: Gate | None = None, log: list[str] | None = None) -> Any:
    async def work(params: Any, ctx: TaskContext) -> str:
        if log is not None:
            log.append(ctx.worker_id)
        if gate is not None:
            await gate.wait()
        return ctx.worker_id

    return work


async def test_a_group_task_runs_on_a_member_only(harness: Harness) -> None:
    ran: list[str] = []
    outsider = harness.consumer("cpu-1", {"work": _handler(log=ran)}, groups=["cpu"])
    await harness.start(outsider)
    option = TaskOption(specific_groups=("gpu",))
    assert await harness.publisher.send(Task("render", "work", {}, option=option))
    await harness.discover()
    await harness.advance(1.0)
    assert harness.claims("render") == []
    member = harness.consumer("gpu-1", {"work": _handler(log=ran)}, groups=["gpu", "eu"])
    await harness.start(member)
    await harness.recorder.wait("finished", 1)
    assert harness.claims("render") == ["gpu-1"]
    assert (await harness.get("render")).status is TaskStatus.SUCCEEDED


async def test_a_member_removed_by_a_live_change_is_revoked(harness: Harness) -> None:
    gate = Gate()
    option = TaskOption(
        specific_groups=("gpu",),
        ping_interval=timedelta(seconds=2),
        worker_timeout=timedelta(seconds=20),
        max_unexpected_retries=0,
    )
    a = harness.consumer("a", {"work": _handler(gate)}, groups=["gpu"])
    b = harness.consumer("b", {"work": _handler(gate)}, groups=["tpu"])
    await harness.start(a, b)
    assert await harness.publisher.send(Task("t", "work", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    await harness.publisher.update_option("t", OptionChange(specific_groups=("tpu",)))
    await harness.advance(2.0)
    await harness.recorder.wait("revoked", 1)
    await harness.discover()
    await harness.recorder.wait("claimed", 2)
    gate.open()
    await harness.recorder.wait("finished", 2)
    info = await harness.get("t")
    assert [(w.worker_id, w.status) for w in info.worker_states] == [
        ("a", AttemptStatus.REVOKED),
        ("b", AttemptStatus.SUCCEEDED),
    ]


async def test_dispatch_count_with_repeats_is_taken_by_the_members_that_ask(harness: Harness) -> None:
    """Seed 002's blocking variant: 5 dispatches for a group of 2; a member that finishes asks
    again (its normal claim loop) and takes the task again until the count is used up."""
    log: list[str] = []
    option = TaskOption(specific_groups=("team",), concurrent_worker_cnt=5, same_worker_may_repeat=True)
    members = [harness.consumer(w, {"work": _handler(log=log)}, groups=["team"]) for w in ("m1", "m2")]
    await harness.start(*members)
    assert await harness.publisher.send(Task("survey", "work", {}, option=option))
    for _ in range(10):
        await harness.discover()
        await harness.advance(1.0)
        if harness.recorder.counts["finished"] >= 5:
            break
    await harness.recorder.wait("finished", 5)
    info = await harness.get("survey")
    assert info.status is TaskStatus.SUCCEEDED
    assert len(info.worker_states) == 5 and set(log) <= {"m1", "m2"} and len(log) == 5


def test_groups_and_worker_ids_are_validated(harness: Harness) -> None:
    driver = harness.new_driver()
    with pytest.raises(InvalidInput):
        Consumer(driver, worker_id="g:gpu")
    with pytest.raises(InvalidInput):
        Consumer(driver, groups=["a|b"])
    with pytest.raises(InvalidInput):
        Consumer(driver, groups="gpu")
    assert Consumer(driver, groups=["gpu", "gpu", "eu"]).groups == ("gpu", "eu")
