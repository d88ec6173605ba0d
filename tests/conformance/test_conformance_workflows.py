"""Workflows on every driver: a graph's blocked steps, the sync that unblocks a step once its
needs succeeded and reports the map steps to fan out, ``expand_map`` (a compare-and-set),
``read_results`` (a map step's: its succeeded items' results in order), a map step's summary
from its items' statuses (both failure policies), the cascade to the workflow, and
``reset_steps``. Every write is followed by ``Store.check_all`` (derived fields as ``derive``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mscheduler.domain.model import Child, Task, TaskOption, item_key
from mscheduler.drivers.base import (
    ExpandMapParams,
    NewTask,
    ResetStepsParams,
    SyncOutcome,
    SyncParentsParams,
)
from mscheduler.publishing import expand
from tests.conformance.support import Store

FAST = TaskOption(retry_delay=timedelta(0), max_unexpected_retries=0)


def graph(store: Store, key: str = "wf", on_failure: str = "fail") -> list[NewTask]:
    """list -> square (map over list) -> total (needs square); side needs list."""
    children = [
        Child("list"),
        Child("square", map_over="list", on_failure=on_failure),
        Child("total", needs=["square"]),
        Child("side", needs=["list"]),
    ]
    return expand(
        Task(key, "wf", {"n": 1}, option=FAST, children=children),
        lambda t: NewTask(t.key, t.name, t.params, t.option.to_storage(store.now)),
    )


async def sync(store: Store, *keys: str) -> SyncOutcome:
    outcome = await store.driver.sync_parents(SyncParentsParams(list(keys), store.now))
    await store.check_all()
    return outcome


async def run(store: Store, key: str, result: Any = None, ok: bool = True) -> None:
    claimed = await store.claim_one("w1", names=["list", "square", "total", "side"])
    assert claimed is not None and claimed.key == key, (claimed, key)
    if ok:
        assert await store.done(claimed, "w1", result)
    else:
        assert await store.fail(claimed, "w1")


async def run_item(store: Store, fail: Any = "none") -> str:
    """Claim an item (the partitions decide which), square its params, or fail it if they are
    ``fail``; returns its key."""
    claimed = await store.claim_one("w1", names=["square"])
    assert claimed is not None and claimed.key.startswith("wf/square/")
    if claimed.params == fail:
        assert await store.fail(claimed, "w1")
    else:
        assert await store.done(claimed, "w1", claimed.params * claimed.params)
    return claimed.key


async def fan_out(store: Store, items: list[Any], on_failure: str = "fail") -> None:
    """What ``publishing.fan_out`` does: the items, then the step recorded fanned out."""
    option = (await store.get("wf/square"))["option"]
    new = [
        NewTask(item_key("wf/square", i), "square", v, option, parent="wf/square", position=i)
        for i, v in enumerate(items)
    ]
    await store.insert(*new)
    assert await store.driver.expand_map(ExpandMapParams("wf/square", len(items), on_failure, store.now))
    await store.check_all()


async def test_steps_that_need_others_are_blocked_and_the_graph_is_stored(store: Store) -> None:
    await store.insert(*graph(store))
    parent = await store.get("wf")
    assert parent["children"]["mode"] == "graph"
    assert parent["children"]["needs"] == [[], ["list"], ["square"], ["list"]]
    assert parent["children"]["maps"][1] == {"over": "list", "on_failure": "fail", "max_items": 10_000}
    total, square = await store.get("wf/total"), await store.get("wf/square")
    assert total["needs"] == [{"name": "square", "key": "wf/square"}]
    assert square["map"]["over"] == "list" and square["state"]["blocked"] is True
    assert total["state"]["blocked"] is True and total["state"]["claim_at"] is None
    assert await store.claim_keys("w1", 5, names=["list", "square", "total", "side"]) == ["wf/list"]


async def test_a_sync_unblocks_what_needs_a_succeeded_step_and_reports_the_map_to_fan_out(
    store: Store,
) -> None:
    await store.insert(*graph(store))
    outcome = await sync(store, "wf")
    assert outcome.expand == [] and (await store.get("wf/side"))["state"].get("blocked") is not False
    await run(store, "wf/list", [3, 4])
    outcome = await sync(store, "wf")
    assert [(e.key, e.source, e.max_items, e.parent) for e in outcome.expand] == [
        ("wf/square", "wf/list", 10_000, "wf")
    ]
    assert (await store.get("wf/side"))["state"]["blocked"] is False  # unblocked
    assert (await store.get("wf/square"))["state"]["blocked"] is True  # fanned out, not unblocked
    assert (await sync(store, "wf")).changed == 0  # idempotent


async def test_expand_map_is_a_compare_and_set_and_items_make_the_map_step_a_parent(store: Store) -> None:
    await store.insert(*graph(store))
    await run(store, "wf/list", [3, 4])
    await fan_out(store, [3, 4])
    again = ExpandMapParams("wf/square", 2, "fail", store.now)
    assert not await store.driver.expand_map(again)  # fanned out already
    step = await store.get("wf/square")
    assert step["children"] == {"mode": "map", "count": 2, "on_failure": "fail"}
    assert step["state"]["status"] == "pending" and step["state"]["claim_at"] is None
    assert await store.driver.count_items("wf/square") == {"pending": 2}
    await run_item(store)
    outcome = await sync(store, "wf/square")
    assert outcome.cascade == ["wf"]  # the map step changed: its workflow is synced next
    assert (await store.state("wf/square"))["children"] == [{"status": "pending"}, {"status": "succeeded"}]
    await run_item(store)
    await sync(store, "wf/square")
    assert (await store.status("wf/square")) == "succeeded"
    await sync(store, "wf")
    assert (await store.get("wf/total"))["state"]["blocked"] is False
    assert await store.driver.count_items("wf/square") == {"succeeded": 2}
    assert await store.driver.count_items("wf/list") == {}  # no items
    read = await store.driver.read_results(["wf/square", "wf/list", "nope"])
    assert read["wf/square"].status == "succeeded" and read["wf/square"].result == [9, 16]  # in order
    assert read["wf/list"].result == [3, 4] and "nope" not in read


async def test_a_failed_item_fails_the_map_step_unless_it_continues(store: Store) -> None:
    for on_failure, status, results in (("fail", "failed", None), ("continue", "succeeded", [4])):
        await store.insert(*graph(store, on_failure=on_failure))
        await run(store, "wf/list", [1, 2])
        await fan_out(store, [1, 2], on_failure)
        await run_item(store, fail=1)
        await run_item(store, fail=1)
        await sync(store, "wf/square")
        assert await store.status("wf/square") == status
        if results is not None:
            assert (await store.driver.read_results(["wf/square"]))["wf/square"].result == results
        await store.driver.reset_steps(ResetStepsParams(["wf/square"], store.now))
        for key in ("wf", "wf/list", "wf/square", "wf/total", "wf/side"):
            await store.driver.control_task(_remove(store, key))


def _remove(store: Store, key: str) -> Any:
    from mscheduler.drivers.base import ControlParams

    statuses = ("pending", "running", "succeeded", "failed", "cancelled", "expired")
    return ControlParams(key, "remove", statuses, store.now)


async def test_reset_steps_blocks_them_and_removes_a_map_steps_items(store: Store) -> None:
    await store.insert(*graph(store))
    await run(store, "wf/list", [1, 2, 3])
    await fan_out(store, [1, 2, 3])
    assert await store.driver.reset_steps(ResetStepsParams(["wf/square", "wf/side"], store.now)) == 2
    await store.check_all()
    square = await store.get("wf/square")
    assert "children" not in square and square["state"]["blocked"] is True
    assert "children" not in square["state"] and square["state"]["status"] == "pending"
    assert (await store.get("wf/side"))["state"]["blocked"] is True
    assert [k for k in [item_key("wf/square", i) for i in range(3)] if k in await _keys(store)] == []
    # the sync reports the map step to fan out again: its source is still succeeded
    assert [e.key for e in (await sync(store, "wf")).expand] == ["wf/square"]


async def _keys(store: Store) -> set[str]:
    return {doc["key"] for doc in await store.all_tasks()}
