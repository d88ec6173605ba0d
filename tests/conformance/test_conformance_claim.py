"""claim: every rule of the claim filter and its order, one test each (SPEC F2, F3, F6, F21)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.conformance.support import LEASE, NAME, Store, stored_option


async def test_a_claim_returns_the_task_and_stores_a_running_entry(store: Store) -> None:
    await store.add("a", params={"n": 7}, priority=3)
    (claimed,) = await store.claim("w1", host="host-1", pid=4242)
    assert claimed.key == "a"
    assert claimed.name == NAME
    assert claimed.params == {"n": 7}
    assert claimed.option == stored_option(store.now, priority=3, retry_delay=timedelta(0))
    assert claimed.attempt == "w1#1"
    assert claimed.attempt_no == 1
    assert claimed.ping_expire_time == store.now + LEASE
    state = await store.state("a")
    assert state["worker_states"] == [
        {
            "worker_id": "w1",
            "attempt": "w1#1",
            "host": "host-1",
            "pid": 4242,
            "status": "running",
            "start_time": store.now,
            "ping_expire_time": store.now + LEASE,
            "end_time": None,
            "retry_at": None,
            "result": None,
            "error": None,
            "final": False,
        }
    ]
    assert (state["status"], state["running_cnt"], state["free_slots"], state["claim_at"]) == (
        "running",
        1,
        0,
        None,
    )
    assert state["update_time"] == store.now


async def test_capacity_at_most_n_distinct_workers_each_once(store: Store) -> None:
    await store.add("a", concurrent_worker_cnt=2)
    assert await store.claim_keys("w1") == ["a"]
    assert await store.claim_keys("w1") == []  # w1 holds a running entry: not twice
    assert await store.claim_keys("w2") == ["a"]
    assert await store.claim_keys("w3") == []  # both slots taken
    state = await store.state("a")
    assert (state["running_cnt"], state["free_slots"], state["claim_at"]) == (2, 0, None)

    entries = await store.entries("a")
    assert await store.finish("a", "w1", entries[0]["attempt"]) is True
    state = await store.state("a")
    assert (state["status"], state["success_cnt"], state["free_slots"]) == ("running", 1, 0)
    assert await store.claim_keys("w3") == []  # the success keeps its slot

    assert await store.finish("a", "w2", entries[1]["attempt"], "released") is True
    assert await store.claim_keys("w1") == []  # w1 succeeded on it: never again
    assert await store.claim_keys("w3") == ["a"]
    assert await store.claim_keys("w2") == []  # full again
    w3 = (await store.entries("a"))[-1]
    assert await store.finish("a", "w3", w3["attempt"]) is True
    state = await store.state("a")
    assert (state["status"], state["success_cnt"], state["claim_at"]) == ("succeeded", 2, None)
    assert await store.claim_keys("w4") == []


async def test_one_claim_call_takes_one_slot_per_task(store: Store) -> None:
    await store.add("a", concurrent_worker_cnt=3)
    claimed = await store.claim("w1", 3)
    assert [c.key for c in claimed] == ["a"]
    assert (await store.state("a"))["free_slots"] == 2


async def test_specific_worker_ids_is_an_allow_list(store: Store) -> None:
    await store.add("a", specific_worker_ids=("w2", "w3", "w4"), concurrent_worker_cnt=3)
    assert await store.claim_keys("w1") == []
    assert await store.claim_keys("w2") == ["a"]
    assert await store.claim_keys("w3") == ["a"]
    assert await store.claim_keys("w1") == []  # a free slot left, still not for w1
    assert (await store.state("a"))["free_slots"] == 1


async def test_a_task_is_not_claimed_before_run_at(store: Store) -> None:
    await store.add("a", run_at=store.at(60))
    assert (await store.state("a"))["claim_at"] == store.at(60)
    assert await store.claim_keys("w1") == []
    store.advance(59.999)
    assert await store.claim_keys("w1") == []
    store.advance(0.001)  # claim_at <= now
    assert await store.claim_keys("w1") == ["a"]


async def test_a_failed_attempt_is_retried_at_retry_at(store: Store) -> None:
    await store.add("a")
    first = await store.claim_one("w1")
    assert first is not None
    assert await store.fail(first, "w1", retry_in=10) is True
    state = await store.state("a")
    assert (state["status"], state["fail_cnt"], state["retry_at"]) == ("pending", 1, store.at(10))
    assert state["claim_at"] == store.at(10)
    store.advance(9)
    assert await store.claim_keys("w1") == []
    assert await store.claim_keys("w2") == []
    store.advance(1)
    second = await store.claim_one("w1")  # the same worker may try again after a failure
    assert second is not None and second.attempt_no == 2


async def test_run_at_later_than_retry_at_wins(store: Store) -> None:
    await store.add("a")
    claimed = await store.claim_one("w1")
    assert claimed is not None
    assert await store.fail(claimed, "w1", retry_in=5) is True
    await store.change_option("a", run_at=store.at(50))
    assert (await store.state("a"))["claim_at"] == store.at(50)
    store.advance(10)
    assert await store.claim_keys("w1") == []
    store.advance(40)
    assert await store.claim_keys("w1") == ["a"]


async def test_the_retry_budget_ends_in_failed(store: Store) -> None:
    await store.add("a", max_unexpected_retries=2)
    for n in range(1, 4):
        claimed = await store.claim_one(f"w{n}")
        assert claimed is not None, n
        assert claimed.attempt_no == n
        assert await store.fail(claimed, f"w{n}", retry_in=0) is True
        state = await store.state("a")
        assert state["fail_cnt"] == n
        if n < 3:
            assert (state["status"], state["claim_at"]) == ("pending", store.now)
    state = await store.state("a")
    assert (state["status"], state["claim_at"], state["free_slots"]) == ("failed", None, 1)
    store.advance(3600)
    for worker in ("w1", "w2", "w3", "w9"):
        assert await store.claim_keys(worker) == []


async def test_a_rejected_attempt_fails_the_task_at_once(store: Store) -> None:
    await store.add("a", max_unexpected_retries=5)
    claimed = await store.claim_one("w1")
    assert claimed is not None
    error = {"type": "InvalidParams", "message": "bad", "traceback": None}
    assert await store.finish("a", "w1", claimed.attempt, "rejected", error=error) is True
    state = await store.state("a")
    assert (state["status"], state["fail_cnt"], state["rejected_cnt"], state["claim_at"]) == (
        "failed",
        1,
        1,
        None,
    )
    assert await store.claim_keys("w2") == []


async def test_released_and_revoked_attempts_do_not_use_the_budget(store: Store) -> None:
    await store.add("a", max_unexpected_retries=0)
    for outcome in ("released", "revoked", "released"):
        claimed = await store.claim_one("w1")
        assert claimed is not None, outcome
        assert await store.finish("a", "w1", claimed.attempt, outcome) is True
        state = await store.state("a")
        assert (state["status"], state["fail_cnt"], state["claim_at"]) == ("pending", 0, store.now)
    assert [e["status"] for e in await store.entries("a")] == ["released", "revoked", "released"]


@pytest.mark.global_claim_order
async def test_higher_priority_is_claimed_first(store: Store) -> None:
    await store.add("low", priority=-1)
    await store.add("zero")
    await store.add("high", priority=5)
    await store.add("mid", priority=1)
    order = [await store.claim_keys("w1") for _ in range(5)]
    assert order == [["high"], ["mid"], ["zero"], ["low"], []]


@pytest.mark.global_claim_order
async def test_earlier_due_time_is_claimed_first_within_a_priority(store: Store) -> None:
    await store.add("c", run_at=store.at(-1))
    await store.add("a", run_at=store.at(-3))
    await store.add("b", run_at=store.at(-2))
    await store.add("later", run_at=store.at(1))
    order = [await store.claim_keys("w1") for _ in range(4)]
    assert order == [["a"], ["b"], ["c"], []]


@pytest.mark.global_claim_order
async def test_tasks_aimed_at_this_worker_come_first_within_a_priority(store: Store) -> None:
    await store.add("anyone", run_at=store.at(-10))  # older, but for anyone
    await store.add("for-w1", specific_worker_ids=("w1",))
    await store.add("for-w2", specific_worker_ids=("w2", "w3"), run_at=store.at(-20))
    await store.add("urgent", priority=1)  # priority still comes before targeting
    assert await store.claim_keys("w1") == ["urgent"]
    assert await store.claim_keys("w1") == ["for-w1"]
    assert await store.claim_keys("w1") == ["anyone"]
    assert await store.claim_keys("w1") == []
    assert await store.claim_keys("w3") == ["for-w2"]


async def test_only_the_given_names_are_claimed(store: Store) -> None:
    await store.add("j", name="job", priority=9)
    await store.add("o", name="other")
    await store.add("t", name="third")
    assert await store.claim_keys("w1", names=["other"]) == ["o"]
    assert await store.claim_keys("w1", 3, names=["other", "third"]) == ["t"]
    assert await store.claim_keys("w1", names=["nothing"]) == []
    assert await store.status("j") == "pending"


@pytest.mark.global_claim_order
async def test_the_number_of_attempt_tokens_bounds_one_claim(store: Store) -> None:
    for i in range(5):
        await store.add(f"t{i}", priority=i)
    claimed = await store.claim("w1", 3)
    assert len(claimed) == 3
    assert {c.key for c in claimed} == {"t4", "t3", "t2"}  # the best three
    assert len({c.attempt for c in claimed}) == 3
    for c in claimed:
        assert (await store.entry(c.key, c.attempt))["worker_id"] == "w1"
    rest = await store.claim("w1", 5)
    assert {c.key for c in rest} == {"t1", "t0"}
    assert await store.claim("w2", 5) == []


async def test_a_claim_lease_ends_at_the_given_expiry(store: Store) -> None:
    await store.add("a")
    claimed = await store.claim_one("w1", lease=timedelta(seconds=7))
    assert claimed is not None
    assert (await store.entry("a", claimed.attempt))["ping_expire_time"] == store.at(7)


async def test_excluded_keys_are_not_claimed(store: Store) -> None:
    """A worker never claims a task it still tracks (say, an outcome not yet written)."""
    await store.add("a", priority=2)
    await store.add("b", priority=1)
    assert await store.claim_keys("w1", 2, exclude_keys=["a"]) == ["b"]
    assert await store.claim_keys("w1", exclude_keys=["a"]) == []
    assert await store.claim_keys("w2", exclude_keys=["b"]) == ["a"]
