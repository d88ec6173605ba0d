"""Checkpoints and progress ride the ping (SPEC F22): fenced like the ping, kept on the task (not
in the entry) so that the next attempt's claim hands them over, cleared by a restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mscheduler import Operations, TaskInfo
from mscheduler.domain.partitions import by_part
from mscheduler.drivers.base import AttemptReport, ClaimedTask, PingParams, PingResult
from mscheduler.drivers.mongo.driver import MongoDriver
from tests.conformance.support import LEASE, Store


async def ping(
    store: Store, worker: str, attempts: dict[str, str], reports: dict[str, AttemptReport]
) -> PingResult:
    params = PingParams(worker, store.now, {store.now + LEASE: attempts}, reports)
    result = await store.driver.ping(params)
    await store.check_all()
    return result


def save(seq: int, data: Any, fraction: float | None = None) -> AttemptReport:
    progress = {"fraction": fraction, "message": f"{fraction:.0%}"} if fraction is not None else None
    return AttemptReport(seq, save_checkpoint=True, checkpoint=data, progress=progress)


async def claimed(store: Store, worker: str) -> ClaimedTask:
    task = await store.claim_one(worker)
    assert task is not None
    return task


async def test_the_next_attempt_claims_the_saved_checkpoint(store: Store) -> None:
    await store.add("t")
    first = await claimed(store, "w1")
    assert first.checkpoint is None
    data = {"step": 3, "cursor": "abc", "when": datetime(2030, 1, 1, tzinfo=UTC), "seen": [1, 2, 3]}
    result = await ping(store, "w1", {"t": first.attempt}, {"t": save(1, data, 0.3)})
    assert result.recorded == ["t"] and "t" in result.alive
    state = await store.state("t")
    assert state["checkpoint"] == {
        "data": data,
        "time": store.now,
        "worker_id": "w1",
        "attempt": first.attempt,
        "seq": 1,
    }
    assert state["progress"] == {
        "fraction": 0.3,
        "message": "30%",
        "time": store.now,
        "worker_id": "w1",
        "attempt": first.attempt,
        "seq": 1,
    }
    assert (await store.entry("t", first.attempt))["ping_expire_time"] == store.now + LEASE  # renewed too
    info = TaskInfo.from_storage(await store.get("t"))
    assert info.checkpoint is not None and info.checkpoint.data == data and info.checkpoint.seq == 1
    assert info.progress is not None and info.progress.fraction == 0.3 and info.progress.message == "30%"

    store.advance(LEASE.total_seconds() + 1)  # w1 crashed: its lease ends
    assert await store.expire() == 1
    second = await claimed(store, "w2")
    assert second.checkpoint == data  # from the claim's own document, no other read


async def test_progress_alone_and_a_checkpoint_of_none(store: Store) -> None:
    await store.add("t")
    task = await claimed(store, "w1")
    progress_only = AttemptReport(1, progress={"fraction": 0.5, "message": None})
    assert (await ping(store, "w1", {"t": task.attempt}, {"t": progress_only})).recorded == ["t"]
    state = await store.state("t")
    assert state["progress"]["fraction"] == 0.5 and state.get("checkpoint") is None
    assert (await ping(store, "w1", {"t": task.attempt}, {"t": save(2, {"a": 1})})).recorded == ["t"]
    assert (await ping(store, "w1", {"t": task.attempt}, {"t": save(3, None)})).recorded == ["t"]
    state = await store.state("t")
    assert state["checkpoint"]["data"] is None and state["checkpoint"]["seq"] == 3
    assert state["progress"]["seq"] == 1  # progress not sent again: kept as it was


async def test_reports_and_plain_pings_in_one_ping(store: Store) -> None:
    for key in ("a", "b", "c"):
        await store.add(key)
    tasks = {c.key: c.attempt for c in await store.claim("w1", 3)}
    assert sorted(tasks) == ["a", "b", "c"]
    commands = store.driver.commands if isinstance(store.driver, MongoDriver) else 0
    reports = {"a": save(1, "A"), "c": save(1, "C")}
    result = await store.driver.ping(PingParams("w1", store.now, {store.now + LEASE: tasks}, reports))
    if isinstance(store.driver, MongoDriver):
        # one bulk write and one read, per partition (one shard) the tasks are in
        touched = len(by_part(tasks, store.driver.partitions))
        assert store.driver.commands - commands == 2 * touched
    await store.check_all()
    assert sorted(result.alive) == ["a", "b", "c"] and sorted(result.recorded) == ["a", "c"]
    for key in ("a", "b", "c"):
        assert (await store.entry(key, tasks[key]))["ping_expire_time"] == store.now + LEASE
    assert (await store.state("a"))["checkpoint"]["data"] == "A"
    assert (await store.state("b")).get("checkpoint") is None
    assert (await store.state("c"))["checkpoint"]["data"] == "C"


async def test_a_worker_that_lost_its_lease_cannot_overwrite_the_checkpoint(store: Store) -> None:
    await store.add("t")
    old = await claimed(store, "w1")
    assert (await ping(store, "w1", {"t": old.attempt}, {"t": save(1, {"step": 1})})).recorded == ["t"]
    store.advance(LEASE.total_seconds() + 1)
    assert await store.expire() == 1
    new = await claimed(store, "w2")
    assert new.checkpoint == {"step": 1}
    assert (await ping(store, "w2", {"t": new.attempt}, {"t": save(1, {"step": 5})})).recorded == ["t"]
    # the old owner wakes up and saves its stale progress: fenced out, nothing changes
    before = await store.get("t")
    result = await ping(store, "w1", {"t": old.attempt}, {"t": save(2, {"step": 2}, 0.2)})
    assert result.lost == ["t"] and result.recorded == [] and not result.alive
    assert await store.get("t") == before


async def test_a_cancelled_or_paused_attempt_cannot_save(store: Store) -> None:
    ops = Operations(store.driver, clock=store.clock)
    for key in ("c", "p"):
        await store.add(key)
    tasks = {c.key: c.attempt for c in await store.claim("w1", 2)}
    await ops.cancel("c")
    await ops.pause("p", stop_running=True)
    before = {key: await store.get(key) for key in tasks}
    result = await ping(store, "w1", tasks, {key: save(1, {"k": key}) for key in tasks})
    assert result.cancelled == ["c"] and result.paused == ["p"]
    assert result.recorded == [] and not result.alive and not result.lost
    assert {key: await store.get(key) for key in tasks} == before


async def test_restart_clears_the_checkpoint_and_progress(store: Store) -> None:
    ops = Operations(store.driver, clock=store.clock)
    await store.add("t", max_unexpected_retries=0)
    task = await claimed(store, "w1")
    assert (await ping(store, "w1", {"t": task.attempt}, {"t": save(1, {"step": 9}, 0.9)})).recorded
    assert await store.fail(task, "w1")
    assert (await store.state("t"))["checkpoint"]["data"] == {"step": 9}  # kept while failed
    info = await ops.restart("t")
    assert info.checkpoint is None and info.progress is None
    again = await claimed(store, "w1")
    assert again.checkpoint is None  # a restart is a fresh generation: from scratch


async def test_a_re_sent_finished_task_starts_from_scratch(store: Store) -> None:
    await store.add("t")
    task = await claimed(store, "w1")
    assert (await ping(store, "w1", {"t": task.attempt}, {"t": save(1, {"step": 9}, 0.9)})).recorded
    assert await store.done(task, "w1")
    assert await store.insert(store.task("t"), reset_finished=True) == [True]
    state = await store.state("t")
    assert state.get("checkpoint") is None and state.get("progress") is None


@pytest.mark.parametrize("delay", [timedelta(0), timedelta(seconds=1)])
async def test_a_report_in_the_claims_millisecond_still_lands(store: Store, delay: timedelta) -> None:
    """A ping in the same millisecond as the claim finds the lease at the asked expiry already
    (the plain ping counts that alive); the report's own seq says whether it landed."""
    await store.add("t")
    task = await claimed(store, "w1")
    store.clock.advance(delay)
    assert (await ping(store, "w1", {"t": task.attempt}, {"t": save(1, 1)})).recorded == ["t"]
