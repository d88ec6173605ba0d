"""expire_leases: expired running entries become lost, use the budget and free their slot (SPEC F3, F4)."""

from __future__ import annotations

from datetime import timedelta

from tests.conformance.support import LEASE, Store

LEASE_EXPIRED = {"type": "LeaseExpired", "message": "the lease expired (no ping)", "traceback": None}


async def test_an_expired_lease_is_marked_lost(store: Store) -> None:
    await store.add("a", max_unexpected_retries=3, retry_delay=timedelta(seconds=10))
    claimed = await store.claim_one("w1")
    assert claimed is not None
    store.advance(LEASE.total_seconds() - 0.001)
    assert await store.expire() == 0
    assert await store.status("a") == "running"
    store.advance(0.001)  # ping_expire_time <= now
    assert await store.expire() == 1
    entry = await store.entry("a", claimed.attempt)
    assert entry["status"] == "lost"
    assert entry["error"] == LEASE_EXPIRED
    assert entry["end_time"] == store.now
    # a lost lease waits the retry policy's delay, like a failure (here retry_delay, 10 s)
    assert entry["retry_at"] == store.now + timedelta(seconds=10)
    state = await store.state("a")
    assert (state["status"], state["fail_cnt"], state["running_cnt"], state["free_slots"]) == (
        "pending",
        1,
        0,
        1,
    )
    assert state["claim_at"] == store.now + timedelta(seconds=10)
    assert state["update_time"] == store.now
    assert await store.expire() == 0  # nothing left to expire


async def test_a_lost_slot_can_be_claimed_by_another_worker(store: Store) -> None:
    await store.add("a")
    first = await store.claim_one("w1")
    assert first is not None
    assert await store.claim_keys("w2") == []
    store.advance(31)
    assert await store.expire() == 1
    second = await store.claim_one("w2")
    assert second is not None and second.attempt_no == 2
    assert await store.status("a") == "running"


async def test_lost_leases_use_the_retry_budget(store: Store) -> None:
    await store.add("a", max_unexpected_retries=1)
    for n in (1, 2):
        claimed = await store.claim_one(f"w{n}")
        assert claimed is not None
        store.advance(31)
        assert await store.expire() == 1
    state = await store.state("a")
    assert (state["status"], state["fail_cnt"], state["claim_at"]) == ("failed", 2, None)
    assert await store.claim_keys("w3") == []


async def test_expire_counts_tasks_and_marks_every_expired_entry(store: Store) -> None:
    # the first lease is min(worker_timeout, the claim's cap): w3's cap of 120 s outlasts 60 s
    await store.add("fan", concurrent_worker_cnt=3, worker_timeout=timedelta(seconds=150))
    await store.add("solo")
    assert await store.claim_keys("w1", 2) in (["fan", "solo"], ["solo", "fan"])
    assert await store.claim_keys("w2") == ["fan"]
    live = await store.claim_one("w3", lease=timedelta(seconds=120))
    assert live is not None and live.key == "fan"
    store.advance(60)
    assert await store.expire() == 2  # two tasks changed
    assert [e["status"] for e in await store.entries("fan")] == ["lost", "lost", "running"]
    assert [e["status"] for e in await store.entries("solo")] == ["lost"]
    state = await store.state("fan")
    assert (state["status"], state["fail_cnt"], state["running_cnt"], state["free_slots"]) == (
        "running",
        2,
        1,
        2,
    )


async def test_expire_leaves_finished_entries_alone(store: Store) -> None:
    await store.add("a", concurrent_worker_cnt=2)
    first = await store.claim_one("w1")
    second = await store.claim_one("w2")
    assert first is not None and second is not None
    assert await store.done(first, "w1", result=1) is True
    assert await store.fail(second, "w2") is True
    store.advance(3600)
    before = await store.get("a")
    assert await store.expire() == 0
    assert await store.get("a") == before
