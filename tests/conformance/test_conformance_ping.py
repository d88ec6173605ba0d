"""ping: batched lease renewal that never revives an expired lease (SPEC F4, F8)."""

from __future__ import annotations

from datetime import timedelta

from mscheduler.drivers.base import PingParams
from tests.conformance.support import LEASE, Store


async def test_a_ping_extends_a_live_lease_and_returns_the_option(store: Store) -> None:
    await store.add("a", priority=2)
    claimed = await store.claim_one("w1")
    assert claimed is not None
    store.advance(20)
    before = await store.state("a")
    result = await store.ping("w1", {"a": claimed.attempt}, lease=timedelta(seconds=30))
    assert result.alive == {"a": claimed.option}
    assert (result.lost, result.revoked) == ([], [])
    assert (await store.entry("a", claimed.attempt))["ping_expire_time"] == store.at(30)
    after = await store.state("a")
    assert after["update_time"] == before["update_time"]  # a ping is not a state change
    assert after["status"] == "running"
    store.advance(25)  # 45 s after the claim: alive thanks to the ping
    assert await store.expire() == 0
    assert await store.done(claimed, "w1") is True


async def test_one_ping_renews_many_tasks_with_different_lease_lengths(store: Store) -> None:
    for key in ("a", "b", "c"):
        await store.add(key)
    claimed = {c.key: c.attempt for c in await store.claim("w1", 3)}
    store.advance(10)
    groups = {store.at(15): {"a": claimed["a"], "b": claimed["b"]}, store.at(90): {"c": claimed["c"]}}
    result = await store.driver.ping(PingParams("w1", store.now, groups))
    assert set(result.alive) == {"a", "b", "c"}
    assert (result.lost, result.revoked) == ([], [])
    assert (await store.entry("a", claimed["a"]))["ping_expire_time"] == store.at(15)
    assert (await store.entry("b", claimed["b"]))["ping_expire_time"] == store.at(15)
    assert (await store.entry("c", claimed["c"]))["ping_expire_time"] == store.at(90)


async def test_a_ping_never_revives_an_expired_lease(store: Store) -> None:
    await store.add("a")
    claimed = await store.claim_one("w1", lease=timedelta(seconds=10))
    assert claimed is not None
    store.advance(10)  # now == ping_expire_time
    result = await store.ping("w1", {"a": claimed.attempt}, lease=timedelta(seconds=60))
    assert (result.alive, result.lost, result.revoked) == ({}, ["a"], [])
    assert (await store.entry("a", claimed.attempt))["ping_expire_time"] == store.now
    assert await store.expire() == 1
    assert (await store.entry("a", claimed.attempt))["status"] == "lost"


async def test_a_ping_classifies_alive_lost_and_revoked_in_one_call(store: Store) -> None:
    await store.add("alive")
    await store.add("finished")
    await store.add("revoked", specific_worker_ids=("w1", "w2"))
    claimed = {c.key: c.attempt for c in await store.claim("w1", 3)}
    assert set(claimed) == {"alive", "finished", "revoked"}
    assert await store.finish("finished", "w1", claimed["finished"]) is True
    await store.change_option("revoked", specific_worker_ids=["w2"])
    revoked_expiry = (await store.entry("revoked", claimed["revoked"]))["ping_expire_time"]
    store.advance(1)
    result = await store.ping("w1", {**claimed, "unknown": "w1#99"})
    assert set(result.alive) == {"alive"}
    assert sorted(result.lost) == ["finished", "unknown"]
    assert result.revoked == ["revoked"]
    entry = await store.entry("revoked", claimed["revoked"])
    assert entry["status"] == "running"  # still ours until the worker reports it
    assert entry["ping_expire_time"] == revoked_expiry  # but not extended


async def test_a_revoked_worker_hands_the_task_back_without_using_the_budget(store: Store) -> None:
    await store.add("a", specific_worker_ids=("w1", "w2"), max_unexpected_retries=0)
    claimed = await store.claim_one("w1")
    assert claimed is not None
    await store.change_option("a", specific_worker_ids=["w2"])
    assert (await store.ping("w1", {"a": claimed.attempt})).revoked == ["a"]
    assert await store.claim_keys("w2") == []  # the revoked entry still holds the only slot
    assert await store.finish("a", "w1", claimed.attempt, "revoked") is True
    state = await store.state("a")
    assert (state["status"], state["fail_cnt"], state["claim_at"]) == ("pending", 0, store.now)
    assert await store.claim_keys("w1") == []
    assert await store.claim_keys("w2") == ["a"]


async def test_a_ping_with_a_wrong_token_or_after_finishing_is_lost(store: Store) -> None:
    await store.add("a")
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert (await store.ping("w1", {"a": "w1#forged"})).lost == ["a"]
    assert await store.done(claimed, "w1") is True
    result = await store.ping("w1", {"a": claimed.attempt})
    assert (result.alive, result.lost) == ({}, ["a"])


async def test_a_ping_reports_a_live_option_change(store: Store) -> None:
    await store.add("a", ping_interval=timedelta(seconds=10), worker_timeout=timedelta(seconds=30))
    claimed = await store.claim_one("w1")
    assert claimed is not None
    await store.change_option("a", ping_interval_ms=2000, worker_timeout_ms=6000)
    result = await store.ping("w1", {"a": claimed.attempt})
    assert result.alive["a"]["ping_interval_ms"] == 2000
    assert result.alive["a"]["worker_timeout_ms"] == 6000


async def test_a_ping_by_a_fan_out_worker_touches_only_its_own_entry(store: Store) -> None:
    await store.add("a", concurrent_worker_cnt=2)
    first = await store.claim_one("w1")
    second = await store.claim_one("w2")
    assert first is not None and second is not None
    store.advance(20)
    assert set((await store.ping("w2", {"a": second.attempt}, lease=LEASE)).alive) == {"a"}
    assert (await store.entry("a", first.attempt))["ping_expire_time"] == store.at(10)
    assert (await store.entry("a", second.attempt))["ping_expire_time"] == store.at(30)
    store.advance(10)
    assert await store.expire() == 1
    assert [e["status"] for e in await store.entries("a")] == ["lost", "running"]


async def test_a_ping_on_a_targeted_fan_out_task_extends_only_the_pingers_entry(store: Store) -> None:
    """The filter also matches specific_worker_ids (an array): the update must still change the
    pinging worker's own entry, never another's (MongoDB's positional "$" cannot promise that)."""
    await store.add("a", concurrent_worker_cnt=2, specific_worker_ids=("w2", "w1"))
    first = await store.claim_one("w1")
    second = await store.claim_one("w2")
    assert first is not None and second is not None
    store.advance(5)
    result = await store.ping("w2", {"a": second.attempt}, lease=timedelta(seconds=60))
    assert set(result.alive) == {"a"}
    assert (await store.entry("a", second.attempt))["ping_expire_time"] == store.at(60)
    assert (await store.entry("a", first.attempt))["ping_expire_time"] == first.ping_expire_time
    result = await store.ping("w1", {"a": first.attempt}, lease=timedelta(seconds=40))
    assert (await store.entry("a", first.attempt))["ping_expire_time"] == store.at(40)
    assert (await store.entry("a", second.attempt))["ping_expire_time"] == store.at(60)
