"""Fencing: a write about an attempt lands only for its worker, its token and a live lease (SPEC G1)."""

from __future__ import annotations

from mscheduler.drivers.base import FinishParams, PingParams
from tests.conformance.support import LEASE, Store


async def _running(store: Store, key: str = "a", worker: str = "w1", **option: object) -> str:
    await store.add(key, **option)  # type: ignore[arg-type]
    claimed = await store.claim_one(worker)
    assert claimed is not None and claimed.key == key
    return claimed.attempt


async def test_a_finish_with_a_wrong_attempt_token_is_rejected(store: Store) -> None:
    attempt = await _running(store)
    before = await store.get("a")
    store.advance(1)
    assert await store.finish("a", "w1", attempt + "x", result=1) is False
    assert await store.finish("a", "w1", "w2#1", result=1) is False
    assert await store.get("a") == before
    assert await store.finish("a", "w1", attempt, result=1) is True


async def test_a_finish_by_another_worker_is_rejected(store: Store) -> None:
    attempt = await _running(store)
    before = await store.get("a")
    store.advance(1)
    assert await store.finish("a", "w2", attempt, result="stolen") is False
    assert await store.get("a") == before


async def test_a_finish_for_an_unknown_task_is_rejected(store: Store) -> None:
    await _running(store)
    assert await store.finish("nope", "w1", "w1#1") is False
    assert [t["key"] for t in await store.all_tasks()] == ["a"]


async def test_a_finish_at_or_after_the_lease_end_is_rejected(store: Store) -> None:
    attempt = await _running(store)
    before = await store.get("a")
    store.advance(LEASE.total_seconds())  # now == ping_expire_time: expired
    assert await store.finish("a", "w1", attempt, result=1) is False
    store.advance(5)
    assert await store.finish("a", "w1", attempt, "failed", retry_in=1) is False
    assert await store.get("a") == before


async def test_a_finish_just_before_the_lease_end_is_accepted(store: Store) -> None:
    attempt = await _running(store)
    store.advance(LEASE.total_seconds() - 0.001)
    assert await store.finish("a", "w1", attempt, result=1) is True
    assert await store.status("a") == "succeeded"


async def test_an_attempt_is_finished_once(store: Store) -> None:
    attempt = await _running(store)
    assert await store.finish("a", "w1", attempt, "failed", retry_in=1) is True
    before = await store.get("a")
    store.advance(0.5)
    assert await store.finish("a", "w1", attempt, "succeeded", result=1) is False
    assert await store.get("a") == before


async def test_a_retried_identical_finish_is_accepted_and_changes_nothing(store: Store) -> None:
    """The reply to a finish may be lost: sending the same outcome again says it landed."""
    attempt = await _running(store)
    assert await store.finish("a", "w1", attempt, result={"v": 1}) is True
    after = await store.get("a")
    assert await store.finish("a", "w1", attempt, result={"v": 1}) is True
    assert await store.finish("a", "w2", attempt, result={"v": 1}) is False  # not for another worker
    assert await store.finish("a", "w1", attempt, "failed", retry_in=1) is False  # not another outcome
    assert await store.get("a") == after


async def test_the_old_owner_cannot_touch_a_task_taken_over(store: Store) -> None:
    old = await _running(store)
    store.advance(LEASE.total_seconds() + 1)
    assert await store.expire() == 1
    new = await store.claim_one("w2")
    assert new is not None and new.attempt_no == 2
    owner_before = await store.entry("a", new.attempt)

    ping = await store.ping("w1", {"a": old})
    assert (ping.alive, ping.lost, ping.revoked) == ({}, ["a"], [])
    assert await store.finish("a", "w1", old, result="late") is False
    assert await store.finish("a", "w1", new.attempt, result="wrong worker") is False
    assert await store.entry("a", new.attempt) == owner_before
    state = await store.state("a")
    assert (state["status"], state["running_cnt"], state["fail_cnt"]) == ("running", 1, 1)
    assert [e["status"] for e in state["worker_states"]] == ["lost", "running"]

    assert await store.done(new, "w2", result="fresh") is True
    doc = await store.get("a")
    assert doc["state"]["status"] == "succeeded"
    assert [e["result"] for e in doc["state"]["worker_states"]] == [None, "fresh"]


async def test_the_old_owner_is_fenced_even_before_expire_leases_runs(store: Store) -> None:
    old = await _running(store)
    store.advance(LEASE.total_seconds() + 1)
    # nobody has marked it lost yet; the entry still says running, but the lease has ended
    assert [e["status"] for e in await store.entries("a")] == ["running"]
    ping = await store.ping("w1", {"a": old})
    assert ping.lost == ["a"]
    assert await store.finish("a", "w1", old) is False
    assert (await store.entry("a", old))["ping_expire_time"] == store.at(-1)


async def test_a_batch_of_finishes_reports_each_one(store: Store) -> None:
    for key in ("a", "b", "c"):
        await store.add(key)
    claimed = {c.key: c for c in await store.claim("w1", 3)}
    assert set(claimed) == {"a", "b", "c"}
    now = store.now
    batch = [
        FinishParams("a", "w1", claimed["a"].attempt, now, "succeeded", result={"ok": 1}),
        FinishParams("b", "w1", "forged", now, "succeeded", result={"ok": 2}),
        FinishParams("c", "w1", claimed["c"].attempt, now, "failed", error={"type": "E", "message": "m"}),
        FinishParams("zzz", "w1", "none", now, "succeeded"),
    ]
    assert await store.driver.finish(batch) == [True, False, True, False]
    await store.check_all()
    assert await store.status("a") == "succeeded"
    assert await store.status("b") == "running"
    assert (await store.state("c"))["fail_cnt"] == 1
    assert await store.driver.finish([]) == []


async def test_a_ping_by_another_worker_neither_extends_nor_reports_alive(store: Store) -> None:
    attempt = await _running(store)
    expire = (await store.entry("a", attempt))["ping_expire_time"]
    store.advance(5)
    result = await store.driver.ping(PingParams("w2", store.now, {store.at(60): {"a": attempt}}))
    assert (result.alive, result.lost, result.revoked) == ({}, ["a"], [])
    assert (await store.entry("a", attempt))["ping_expire_time"] == expire
