"""The change stream and the memory driver agree on which writes wake a consumer.

The memory driver announces a write to its watchers when it makes the task claimable by someone
new or asks running attempts to stop; the Mongo driver marks the same writes by bumping the
task's top-level ``wake``, which the change stream's leading ``$match`` (``watch_pipeline``)
passes, pushed down to the oplog scan. A write one driver announces and the other does not is
a consumer woken on one store and left to its next poll on the other.

For every kind of write, the same steps run on both drivers (one fake clock each, the same
tokens); then the write under test. On the memory driver: what a watcher of the task's name got.
On the Mongo driver (the patched mongomock): the change event a server builds for that write —
an insert with its document, an update with the fields it changed (``updatedFields``, dotted
paths as the server's diff reports them), a delete — run through the stream's leading
``$match``. The two must name the same tasks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any

import pytest

from mscheduler.domain.model import Task, TaskOption
from mscheduler.drivers.base import (
    AttemptReport,
    ControlParams,
    ExpireParams,
    NewTask,
    PingParams,
    SyncParentsParams,
)
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.common import watch_pipeline
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.publishing import expand
from mscheduler.testing.clock import FakeClock
from mscheduler.testing.mongomock import mongomock_database
from tests.conformance.support import LEASE, NAME, Store

Write = Callable[[], Awaitable[Any]]
Scenario = Callable[[Store], Awaitable[Write]]
LIVE = ("pending", "running")
NAMES = [NAME, "a", "b"]  # the tasks' names (a family's children are "a" and "b")


async def _running(store: Store, key: str = "t", **option: Any) -> Any:
    await store.add(key, **option)
    claimed = await store.claim_one("w1")
    assert claimed is not None
    return claimed


def _control(store: Store, action: str, statuses: tuple[str, ...] = LIVE, **options: Any) -> Write:
    return lambda: store.driver.control_task(ControlParams("t", action, statuses, store.now, **options))


# -- the writes ---------------------------------------------------------------------------------------


async def insert_new(store: Store) -> Write:
    return lambda: store.add("t")


async def insert_an_existing_key(store: Store) -> Write:
    await store.add("t")
    return lambda: store.add("t")


async def reset_a_finished_task(store: Store) -> Write:
    claimed = await _running(store)
    await store.done(claimed, "w1")
    return lambda: store.insert(store.task("t", params={"again": True}), reset_finished=True)


async def claim(store: Store) -> Write:
    await store.add("t")
    return lambda: store.claim("w1")


async def claim_a_slot_of_a_fan_out(store: Store) -> Write:
    await store.add("t", concurrent_worker_cnt=3)
    return lambda: store.claim("w1")


async def ping(store: Store) -> Write:
    claimed = await _running(store)
    return lambda: store.ping("w1", {"t": claimed.attempt})


async def ping_with_a_checkpoint(store: Store) -> Write:
    claimed = await _running(store)
    report = AttemptReport(1, save_checkpoint=True, checkpoint={"at": 3}, progress={"fraction": 0.5})
    expires = {store.at(LEASE.total_seconds()): {"t": claimed.attempt}}
    return lambda: store.driver.ping(PingParams("w1", store.now, expires, reports={"t": report}))


async def succeed(store: Store) -> Write:
    claimed = await _running(store)
    return lambda: store.done(claimed, "w1")


async def fail_with_retries_left(store: Store) -> Write:
    claimed = await _running(store, max_unexpected_retries=3)
    return lambda: store.fail(claimed, "w1", retry_in=0)


async def fail_the_last_retry(store: Store) -> Write:
    claimed = await _running(store, max_unexpected_retries=0)
    return lambda: store.fail(claimed, "w1", retry_in=0)


async def release(store: Store) -> Write:
    claimed = await _running(store)
    return lambda: store.finish("t", "w1", claimed.attempt, "released")


async def snooze(store: Store) -> Write:
    claimed = await _running(store)
    return lambda: store.finish("t", "w1", claimed.attempt, "snoozed", retry_in=5)


async def reject(store: Store) -> Write:
    claimed = await _running(store, max_unexpected_retries=3)
    error = {"type": "InvalidParams", "message": "no", "traceback": None}
    return lambda: store.finish("t", "w1", claimed.attempt, "rejected", error=error)


async def lose_a_lease(store: Store) -> Write:
    await _running(store, max_unexpected_retries=3)
    store.advance(LEASE.total_seconds() + 1)
    return store.expire


async def expire_a_deadline(store: Store) -> Write:
    await store.add("t", deadline=store.at(5))
    store.advance(10)
    return lambda: store.driver.expire_deadlines(ExpireParams(store.now))


async def cancel_a_pending_task(store: Store) -> Write:
    await store.add("t")
    return _control(store, "cancel")


async def cancel_a_running_task(store: Store) -> Write:
    await _running(store)
    return _control(store, "cancel")


async def settle_a_cancelled_attempt(store: Store) -> Write:
    claimed = await _running(store)
    await _control(store, "cancel")()
    return lambda: store.finish("t", "w1", claimed.attempt, "cancelled")


async def pause_a_pending_task(store: Store) -> Write:
    await store.add("t")
    return _control(store, "pause")


async def pause_a_running_task_and_stop_it(store: Store) -> Write:
    await _running(store)
    return _control(store, "pause", stop_running=True)


async def resume(store: Store) -> Write:
    await store.add("t")
    await _control(store, "pause")()
    return _control(store, "resume", ("pending",))


async def restart_a_failed_task(store: Store) -> Write:
    claimed = await _running(store, max_unexpected_retries=0)
    await store.fail(claimed, "w1")
    return _control(store, "restart", ("failed",))


async def remove(store: Store) -> Write:
    await store.add("t")
    return _control(store, "remove", ("pending",))


async def edit_the_priority(store: Store) -> Write:
    await store.add("t")
    return lambda: store.change_option("t", priority=5)


async def aim_at_another_worker(store: Store) -> Write:
    await store.add("t")
    return lambda: store.change_option("t", specific_worker_ids=["w9"])


async def raise_the_budget_of_a_failed_task(store: Store) -> Write:
    claimed = await _running(store, max_unexpected_retries=0)
    await store.fail(claimed, "w1", retry_in=0)
    return lambda: store.change_option("t", max_unexpected_retries=2)


async def unblock_the_next_child(store: Store) -> Write:
    fast = TaskOption(retry_delay=timedelta(0), max_unexpected_retries=0)
    family = expand(
        Task("t", NAME, children=["a", "b"], children_mode="sequential", option=fast),
        lambda t: NewTask(t.key, t.name, t.params, t.option.to_storage(store.now)),
    )
    await store.insert(*family)
    first = await store.claim_one("w1", names=["a"])
    assert first is not None
    await store.done(first, "w1")
    return lambda: store.driver.sync_parents(SyncParentsParams(["t"], store.now))


SCENARIOS: list[Any] = [
    insert_new,
    insert_an_existing_key,
    pytest.param(
        reset_a_finished_task,
        marks=pytest.mark.xfail(
            strict=True,
            raises=AssertionError,
            reason="M4: reset_finished does not bump wake on MongoDB (the engine helper fixes it)",
        ),
    ),
    claim,
    claim_a_slot_of_a_fan_out,
    ping,
    ping_with_a_checkpoint,
    succeed,
    fail_with_retries_left,
    fail_the_last_retry,
    release,
    snooze,
    reject,
    lose_a_lease,
    expire_a_deadline,
    cancel_a_pending_task,
    cancel_a_running_task,
    settle_a_cancelled_attempt,
    pause_a_pending_task,
    pause_a_running_task_and_stop_it,
    resume,
    restart_a_failed_task,
    remove,
    edit_the_priority,
    aim_at_another_worker,
    raise_the_budget_of_a_failed_task,
    unblock_the_next_child,
]


# -- the two sides ------------------------------------------------------------------------------------


async def announced_by_memory(scenario: Scenario) -> set[str]:
    """The tasks whose write a watcher of their name got from the memory driver."""
    clock = FakeClock()
    store = Store(MemoryDriver(clock=clock), clock)
    write = await scenario(store)
    watcher = store.driver.watch(NAMES)
    try:
        await write()
        return {event.key for event in watcher.queue}
    finally:
        await watcher.aclose()


async def passed_by_the_stream(scenario: Scenario) -> set[str]:
    """The tasks whose change event (as a server builds it for the write) passes the stream's
    leading ``$match`` on the Mongo driver."""
    clock = FakeClock()
    database = mongomock_database()
    driver = MongoDriver(database)
    await driver.setup()
    store = Store(driver, clock)
    write = await scenario(store)
    tasks = database["mscheduler_tasks"]
    before = {doc["_id"]: doc async for doc in tasks.find({})}
    await write()
    after = {doc["_id"]: doc async for doc in tasks.find({})}
    events = change_events(before, after)
    if not events:
        return set()
    scratch = mongomock_database()["events"]
    await scratch.insert_many(events)
    match = watch_pipeline()[0]
    assert list(match) == ["$match"]
    return {event["documentKey"]["_id"] async for event in scratch.aggregate([match])}


def change_events(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The change events of the documents that changed from ``before`` to ``after``."""
    events = []
    for key in sorted(set(before) | set(after)):
        common: dict[str, Any] = {"_id": {"_data": f"{len(events)}"}, "documentKey": {"_id": key}}
        if key not in before:
            events.append(common | {"operationType": "insert", "fullDocument": after[key]})
        elif key not in after:
            events.append(common | {"operationType": "delete"})
        elif before[key] != after[key]:
            updated, removed = diff(before[key], after[key])
            description = {"updatedFields": updated, "removedFields": removed, "truncatedArrays": []}
            events.append(common | {"operationType": "update", "updateDescription": description})
    return events


def diff(
    old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = ""
) -> tuple[dict[str, Any], list[str]]:
    """An update's ``updatedFields`` and ``removedFields``: a field of an embedded document that
    changed by its dotted path, an array or any other value whole."""
    updated: dict[str, Any] = {}
    removed = [f"{prefix}{name}" for name in old if name not in new]
    for name, value in new.items():
        if name in old and old[name] == value:
            continue
        if isinstance(value, Mapping) and isinstance(old.get(name), Mapping):
            inner, gone = diff(old[name], value, f"{prefix}{name}.")
            updated |= inner
            removed += gone
        else:
            updated[f"{prefix}{name}"] = value
    return updated, removed


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_a_write_the_memory_driver_announces_passes_the_change_streams_match(
    scenario: Scenario,
) -> None:
    memory = await announced_by_memory(scenario)
    mongo = await passed_by_the_stream(scenario)
    assert memory == mongo, (
        f"announced by the memory driver: {sorted(memory)}; by the stream: {sorted(mongo)}"
    )


def test_the_scenarios_cover_writes_that_wake_and_writes_that_do_not() -> None:
    """Both answers occur (a comparison of two empty sets everywhere would show nothing)."""
    import asyncio

    async def both() -> tuple[int, int]:
        woke = quiet = 0
        for scenario in (insert_new, ping, fail_with_retries_left, succeed, cancel_a_running_task):
            if await announced_by_memory(scenario):
                woke += 1
            else:
                quiet += 1
        return woke, quiet

    assert asyncio.run(both()) == (3, 2)
