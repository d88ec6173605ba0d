"""Child tasks on every driver: the family insert, blocked children, the parent's derived status,
``sync_parents`` (summary + unblocking, idempotent), ``find_open_parents`` and ``mark_task``.

Every write is followed by ``Store.check_all``: the stored derived fields of parents and children
must equal ``mscheduler.domain.state.derive`` (the Mongo driver's pipeline stages included)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mscheduler.domain.model import Child, OptionChange, Task, TaskOption
from mscheduler.drivers.base import MarkParams, NewTask, OpenParentsParams, SyncParentsParams
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.publishing import expand
from tests.conformance.support import Store

FAST = TaskOption(retry_delay=timedelta(0), max_unexpected_retries=0)


def family(store: Store, key: str = "etl", mode: str | None = None, **task: Any) -> list[NewTask]:
    task.setdefault("children", ["fetch", "transform", "load"])
    task.setdefault("option", FAST)
    return expand(
        Task(key, "etl", {"n": 1}, children_mode=mode, **task),
        lambda t: NewTask(t.key, t.name, t.params, t.option.to_storage(store.now)),
    )


async def sync(store: Store, *keys: str) -> int:
    changed = await store.driver.sync_parents(SyncParentsParams(list(keys), store.now))
    await store.check_all()
    return changed


async def summary(store: Store, key: str = "etl") -> list[str]:
    return [c["status"] for c in (await store.state(key))["children"]]


async def test_a_family_is_inserted_once_the_parent_never_claimable(store: Store) -> None:
    assert await store.insert(*family(store)) == [True, True, True, True]
    assert await store.insert(*family(store)) == [False, False, False, False]
    parent = await store.get("etl")
    assert parent["state"]["status"] == "pending"
    assert parent["state"]["claim_at"] is None and parent["state"]["claimers"] == []
    assert parent["children"]["keys"] == ["etl/fetch", "etl/transform", "etl/load"]
    child = await store.get("etl/transform")
    assert (child["parent"], child["position"], child["params"]) == ("etl", 1, {"n": 1})
    # the parent's name is no handler: even a worker handling it claims nothing
    names = ["etl", "fetch", "transform", "load"]
    assert await store.claim_keys("w1", 5, names=names) == ["etl/fetch"]


async def test_children_take_their_own_params_and_options(store: Store) -> None:
    children = [Child("fetch", params={"url": "u"}, option=OptionChange(priority=7)), "load"]
    await store.insert(*family(store, children=children))
    fetch, load = await store.get("etl/fetch"), await store.get("etl/load")
    assert (fetch["params"], fetch["option"]["priority"]) == ({"url": "u"}, 7)
    assert (load["params"], load["option"]["priority"]) == ({"n": 1}, 0)
    assert fetch["option"]["max_unexpected_retries"] == 0  # the rest is the parent's


async def test_sequential_children_are_unblocked_one_after_another(store: Store) -> None:
    await store.insert(*family(store))
    fetch = await store.claim_one("w1", names=["fetch", "transform", "load"])
    assert fetch is not None and fetch.key == "etl/fetch" and fetch.parent == "etl"
    assert await sync(store, "etl") == 1
    assert (await store.status("etl"), await summary(store)) == ("running", ["running", "pending", "pending"])
    assert await store.done(fetch, "w1")
    assert await store.claim_keys("w2", 3, names=["transform", "load"]) == []  # not synced yet
    assert await sync(store, "etl") == 1
    assert await sync(store, "etl") == 0  # idempotent
    assert await summary(store) == ["succeeded", "pending", "pending"]
    assert (await store.get("etl/transform"))["state"]["blocked"] is False
    assert await store.claim_keys("w2", 3, names=["transform", "load"]) == ["etl/transform"]


async def test_the_parent_succeeds_when_every_child_has(store: Store) -> None:
    await store.insert(*family(store, mode="parallel"))
    claimed = await store.claim("w1", 3, names=["fetch", "transform", "load"])
    assert sorted(c.key for c in claimed) == ["etl/fetch", "etl/load", "etl/transform"]
    for task in claimed:
        assert await store.done(task, "w1", result=task.key)
    await sync(store, "etl")
    assert await store.status("etl") == "succeeded"
    assert await store.driver.find_open_parents(OpenParentsParams()) == []


async def test_a_child_failed_for_good_fails_the_parent_and_later_children_stay_blocked(store: Store) -> None:
    await store.insert(*family(store))
    fetch = await store.claim_one("w1", names=["fetch"])
    assert fetch is not None and await store.fail(fetch, "w1")
    await sync(store, "etl")
    assert (await store.status("etl"), await summary(store)) == ("failed", ["failed", "pending", "pending"])
    assert (await store.get("etl/transform"))["state"]["blocked"] is True
    assert await store.claim_keys("w1", 3, names=["fetch", "transform", "load"]) == []


async def test_in_parallel_mode_the_parent_fails_only_once_no_sibling_runs(store: Store) -> None:
    await store.insert(*family(store, mode="parallel", children=["a", "b"]))
    a = await store.claim_one("w1", names=["a"])
    b = await store.claim_one("w1", names=["b"])
    assert a is not None and await store.fail(a, "w1")
    await sync(store, "etl")
    assert await store.status("etl") == "running"  # b runs on
    assert b is not None and await store.done(b, "w1")
    await sync(store, "etl")
    assert (await store.status("etl"), await summary(store)) == ("failed", ["failed", "succeeded"])


async def test_a_lost_lease_of_a_child_is_seen_by_the_next_sync(store: Store) -> None:
    await store.insert(*family(store, children=["a"]))
    assert await store.claim_keys("w1", names=["a"]) == ["etl/a"]
    await sync(store, "etl")
    store.advance(31)
    assert await store.expire() == 1
    await sync(store, "etl")
    assert await store.status("etl") == "failed"  # the budget was 0


async def test_sync_ignores_unknown_keys_and_plain_tasks(store: Store) -> None:
    await store.add("plain")
    assert await sync(store, "plain", "nothing") == 0
    assert "children" not in (await store.state("plain"))


@pytest.mark.global_claim_order
async def test_open_parents_are_listed_in_key_order_a_page_at_a_time(store: Store) -> None:
    for key in ("p3", "p1", "p2", "p4"):
        await store.insert(*family(store, key, children=["a"]))
    await store.add("plain")
    done = await store.claim_one("w1", names=["a"])  # the oldest: p3's child
    assert done is not None and done.key == "p3/a" and await store.done(done, "w1")
    await sync(store, "p3")
    find = store.driver.find_open_parents
    assert await find(OpenParentsParams()) == ["p1", "p2", "p4"]
    assert await find(OpenParentsParams(after="p1", limit=1)) == ["p2"]


async def test_a_status_set_by_hand_is_a_compare_and_set_and_a_restart_clears_it(store: Store) -> None:
    await store.insert(*family(store, children=["a", "b"]))
    claimed = await store.claim_one("w1", names=["a"])
    assert claimed is not None
    mark = MarkParams("etl/a", "succeeded", ("pending", "failed"), store.now, "done by hand", "ops")
    assert not await store.driver.mark_task(mark)  # running
    assert await store.fail(claimed, "w1")
    assert await store.driver.mark_task(mark)
    await store.check_all()
    state = await store.state("etl/a")
    assert (state["status"], state["claim_at"]) == ("succeeded", None)
    assert state["marked"] == {
        "status": "succeeded",
        "reason": "done by hand",
        "by": "ops",
        "time": store.now,
    }
    await sync(store, "etl")
    assert await summary(store) == ["succeeded", "pending"]
    assert await store.claim_keys("w1", names=["a", "b"]) == ["etl/b"]
    assert not await store.driver.mark_task(mark)  # succeeded is not among the statuses asked


async def test_a_parent_edited_into_junk_is_skipped_not_fatal(store: Store) -> None:
    await store.insert(*family(store, "bad", children=["a"]))
    await store.insert(*family(store, "good", children=["a"]))
    if isinstance(store.driver, MemoryDriver):
        store.driver._tasks["bad"]["children"] = {"mode": "sequential"}
    else:
        assert isinstance(store.driver, MongoDriver)
        await store.driver.tasks.update_one({"_id": "bad"}, {"$set": {"children": {"mode": "sequential"}}})
    claimed = await store.claim("w1", 2, names=["a"])
    for task in claimed:
        assert await store.done(task, "w1")
    assert await store.driver.sync_parents(SyncParentsParams(["bad", "good"], store.now)) == 1
    assert await store.status("good") == "succeeded"


async def test_a_failed_parent_with_blocked_children_is_not_finished_until_they_are(store: Store) -> None:
    from mscheduler.services.retention import Retention, RetentionService

    await store.insert(*family(store))
    fetch = await store.claim_one("w1", names=["fetch"])
    assert fetch is not None and await store.fail(fetch, "w1")
    await sync(store, "etl")
    assert await store.status("etl") == "failed"
    # failed, but two children wait behind the failed one: no finish time, so retention (the
    # pass here, a TTL index on a real server) cannot remove the parent and leave them behind
    assert (await store.state("etl"))["finish_time"] is None
    store.advance(3600)
    service = RetentionService(store.driver, Retention(failed=timedelta(seconds=60)), clock=store.clock)
    assert await service.run_once() == 0  # the failed child is not removed alone either
    assert await store.get("etl/fetch") is not None and await store.get("etl") is not None
    # the family ends when its last children end
    for key in ("etl/transform", "etl/load"):
        params = MarkParams(key, "cancelled", ["pending"], store.now, reason="given up", by="operator")
        assert await store.driver.mark_task(params)
    await sync(store, "etl")
    assert (await store.state("etl"))["finish_time"] == store.now
    # the pass removes the family whole, children first, once the parent's period is over
    store.advance(30)
    assert await service.run_once() == 0
    store.advance(31)
    assert await service.run_once() == 1
    for key in ("etl", "etl/fetch", "etl/transform", "etl/load"):
        assert await store.driver.get_task(key) is None, key


async def test_retention_never_removes_a_child_alone(store: Store) -> None:
    from mscheduler.services.retention import Retention, RetentionService

    await store.insert(*family(store, mode="parallel", children=["a", "b"]))
    a = await store.claim_one("w1", names=["a"])
    assert a is not None and await store.done(a, "w1")
    await sync(store, "etl")
    store.advance(3600)
    service = RetentionService(store.driver, Retention(succeeded=timedelta(seconds=60)), clock=store.clock)
    assert await service.run_once() == 0  # etl/a succeeded long ago, but its family runs on
    assert await store.get("etl/a") is not None
    assert await summary(store) == ["succeeded", "pending"]
