"""What drivers hand back: aware UTC datetimes, and user data stored literally (no operators)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from mscheduler.domain.listing import ListParams
from mscheduler.drivers.base import WakeupParams, WorkerInfo
from tests.conformance.support import NAME, Store, naive_datetimes

OPERATOR_LOOKING = {
    "$gt": "",
    "$where": "function() { return true; }",
    "nested": {"$in": ["$x", "$$NOW"], "$literal": {"$set": 1}},
    "list": ["$field", {"$ne": None}, ["$$ROOT"]],
    "plain": "$$CURRENT.key",
}


async def test_every_returned_datetime_is_aware_utc(store: Store) -> None:
    await store.add("a", params={"when": store.at(5), "list": [store.at(6)]}, run_at=store.at(0))
    await store.add("later", run_at=store.at(100))
    claimed = await store.claim("w1", host="h", pid=1)
    assert not naive_datetimes(claimed)
    assert claimed[0].key == "a"
    assert not naive_datetimes(await store.ping("w1", {"a": claimed[0].attempt}))
    assert await store.finish("a", "w1", claimed[0].attempt, result={"at": store.now}) is True
    for doc in await store.driver.list_tasks(ListParams()):
        assert not naive_datetimes(doc), doc["key"]
    assert not naive_datetimes(await store.get("a"))
    wakeups = await store.driver.find_wakeups(WakeupParams("w1", [NAME], store.now))
    assert wakeups and not naive_datetimes(wakeups)
    await store.driver.register_worker(WorkerInfo("w1", "h", 1, [NAME], 1, store.now))
    await store.driver.request_worker_stop("w1", store.now)
    await store.driver.unregister_worker("w1", store.now)
    assert not naive_datetimes(await store.driver.list_workers())


async def test_times_in_other_zones_come_back_as_the_same_instant_in_utc(store: Store) -> None:
    plus_two = timezone(timedelta(hours=2))
    run_at = (store.now + timedelta(seconds=30)).astimezone(plus_two)
    await store.add("a", params={"local": run_at}, run_at=run_at)
    doc = await store.get("a")
    assert doc["option"]["run_at"] == store.at(30)
    assert doc["option"]["run_at"].utcoffset() == timedelta(0)
    assert doc["params"]["local"] == store.at(30)
    assert doc["params"]["local"].utcoffset() == timedelta(0)


async def test_sub_millisecond_times_are_cut_the_same_way_everywhere(store: Store) -> None:
    run_at = store.now + timedelta(seconds=1, microseconds=999)
    await store.add("a", params={"t": run_at}, run_at=run_at)
    doc = await store.get("a")
    assert doc["option"]["run_at"] == store.at(1)
    assert doc["state"]["claim_at"] == store.at(1)
    assert doc["params"]["t"] == store.at(1)


async def test_results_and_errors_that_look_like_operators_are_stored_literally(store: Store) -> None:
    await store.add("ok")
    await store.add("bad")
    claimed = {c.key: c for c in await store.claim("w1", 2)}
    assert await store.finish("ok", "w1", claimed["ok"].attempt, result=OPERATOR_LOOKING) is True
    error = {"type": "$gt", "message": "{'$gt': ''}", "traceback": "$$NOW", "extra": {"$ne": 1}}
    assert await store.finish("bad", "w1", claimed["bad"].attempt, "failed", error=error, retry_in=1) is True
    ok = await store.entry("ok", claimed["ok"].attempt)
    assert ok["result"] == OPERATOR_LOOKING
    assert ok["status"] == "succeeded"
    bad = await store.entry("bad", claimed["bad"].attempt)
    assert bad["error"] == error
    assert bad["result"] is None


async def test_scalar_results_that_look_like_field_paths_are_stored_literally(store: Store) -> None:
    for key in ("s", "l", "n"):
        await store.add(key)
    claimed = {c.key: c for c in await store.claim("w1", 3)}
    results = {"s": "$state.status", "l": ["$key", "$$ROOT"], "n": None}
    for key, value in results.items():
        assert await store.finish(key, "w1", claimed[key].attempt, result=value) is True
    for key, value in results.items():
        assert (await store.entry(key, claimed[key].attempt))["result"] == value


async def test_params_and_keys_that_look_like_operators_are_stored_literally(store: Store) -> None:
    params = {"q": "$gt", "list": ["$x", {"k": "$$NOW"}], "when": datetime(2031, 1, 1, tzinfo=UTC)}
    for key in ("$gt", '{"$gt": ""}', "a.b"):
        assert await store.add(key, params=params) is True
    assert await store.add("$gt") is False  # still idempotent
    claimed = {c.key: c for c in await store.claim("w1", 3)}
    assert set(claimed) == {"$gt", '{"$gt": ""}', "a.b"}
    for key, c in claimed.items():
        assert c.params == params
        assert await store.done(c, "w1", result=key) is True
        doc = await store.get(key)
        assert (doc["key"], doc["params"], doc["state"]["status"]) == (key, params, "succeeded")
