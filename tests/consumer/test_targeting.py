"""Targeting (SPEC F6) and live option changes (SPEC F8) as consumers see them."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from mscheduler import OptionChange, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.domain.model import AttemptStatus
from tests.consumer.support import Gate, Harness


def _handler(
    gate: Gate | None = None, log: list[str] | None = None, cancelled: list[str] | None = None
) -> Any:
    async def work(params: Any, ctx: TaskContext) -> str:
        if log is not None:
            log.append(ctx.worker_id)
        if gate is not None:
            try:
                await gate.wait()
            except asyncio.CancelledError:
                if cancelled is not None:
                    cancelled.append(ctx.worker_id)
                raise
        return ctx.worker_id

    return work


async def test_only_the_named_worker_runs_a_targeted_task(harness: Harness) -> None:
    ran: list[str] = []
    option = TaskOption(specific_worker_ids=("w1",))
    others = [harness.consumer(w, {"work": _handler(log=ran)}) for w in ("w2", "w3")]
    await harness.start(*others)
    assert await harness.publisher.send(Task("aimed", "work", {}, option=option))
    assert await harness.publisher.send(Task("free", "work", {}))
    await harness.discover()
    await harness.advance(1.0)
    await harness.recorder.wait("finished", 1)
    assert harness.claims("aimed") == []
    assert (await harness.get("aimed")).status is TaskStatus.PENDING

    named = harness.consumer("w1", {"work": _handler(log=ran)})
    await harness.start(named)
    await harness.recorder.wait("finished", 2)
    await harness.discover()
    assert harness.claims("aimed") == ["w1"]
    info = await harness.get("aimed")
    assert info.status is TaskStatus.SUCCEEDED
    assert info.results == ["w1"]
    assert ran.count("w1") == 1 and len(ran) == 2


async def test_worker_removed_from_allow_list_is_revoked_at_next_ping(harness: Harness) -> None:
    """SPEC F8: the running worker stops at its next ping; the slot goes to an allowed worker."""
    gate = Gate()
    log: list[str] = []
    cancelled: list[str] = []
    option = TaskOption(
        specific_worker_ids=("w1",),
        ping_interval=timedelta(seconds=2),
        worker_timeout=timedelta(seconds=20),
        max_unexpected_retries=0,  # a revocation must not use the budget, or the task would fail
    )
    w1, w2, w3 = (harness.consumer(w, {"work": _handler(gate, log, cancelled)}) for w in ("w1", "w2", "w3"))
    await harness.start(w1, w2, w3)
    assert await harness.publisher.send(Task("t", "work", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    assert harness.claims("t") == ["w1"]

    await harness.publisher.update_option("t", OptionChange(specific_worker_ids=("w2",)))
    await harness.discover()
    assert harness.claims("t") == ["w1"], "the slot is still held by w1 until its ping"
    assert harness.recorder.counts["revoked"] == 0

    await harness.advance(2.0)  # w1's ping interval
    await harness.recorder.wait("revoked", 1)
    await harness.recorder.wait("finished", 1)
    assert harness.finished()[0][0] == "w1"
    assert harness.finished()[0][1]["outcome"] == "revoked"
    assert cancelled == ["w1"]
    await harness.discover()  # change streams would tell w2 at once; polling is the floor
    await harness.recorder.wait("claimed", 2)
    assert harness.claims("t") == ["w1", "w2"]

    gate.open()
    await harness.recorder.wait("finished", 2)
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED
    assert [(w.worker_id, w.status) for w in info.worker_states] == [
        ("w1", AttemptStatus.REVOKED),
        ("w2", AttemptStatus.SUCCEEDED),
    ]
    assert info.fail_cnt == 0
    assert info.results == ["w2"]
    assert "w3" not in harness.claims()
    assert log == ["w1", "w2"] and cancelled == ["w1"]


async def test_new_ping_interval_applies_from_the_next_ping(harness: Harness) -> None:
    gate = Gate()
    option = TaskOption(ping_interval=timedelta(seconds=2), worker_timeout=timedelta(seconds=60))
    consumer = harness.consumer("w1", {"work": _handler(gate)}, poll_interval=100.0)
    await harness.start(consumer)
    await harness.publisher.send(Task("t", "work", {}, option=option))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)

    await harness.advance(2.0)
    await harness.recorder.wait("ping", 1)
    await harness.publisher.update_option("t", OptionChange(ping_interval=timedelta(seconds=5)))
    await harness.advance(2.0)  # the pinger was already asleep for the old interval
    await harness.recorder.wait("ping", 2)
    lease_after_second_ping = (await harness.get("t")).worker_states[0].ping_expire_time
    assert lease_after_second_ping == harness.clock.now() + timedelta(seconds=60)

    await harness.advance(4.0)  # the old interval would have pinged twice by now
    assert harness.recorder.counts["ping"] == 2
    await harness.advance(1.0)
    await harness.recorder.wait("ping", 3)
    assert (await harness.get("t")).worker_states[0].ping_expire_time == harness.clock.now() + timedelta(
        seconds=60
    )
    gate.open()
    await harness.recorder.wait("finished", 1)
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED
