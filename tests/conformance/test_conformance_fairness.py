"""Fairness lanes and priority aging in the claim, on every driver.

A task with a fairness key carries it in its claimer tokens (``name#key|who``): a claim of one
lane reads that lane's tasks only; a claim round deals its attempts over the lanes it is given, in
turn, and reports the lanes where it found nothing. A task that ages is ordered by its due time
moved back by ``priority x aging`` within claim priority 0.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from mscheduler.drivers.base import KeyWaitParams, LaneParams, WakeupParams
from tests.conformance.support import NAME, Store


async def test_a_task_with_a_fairness_key_is_in_its_lane_only(store: Store) -> None:
    await store.add("a1", fair_key="acme")
    await store.add("plain")
    state = await store.state("a1")
    assert state["claimers"] == [f"{NAME}#acme|*"]
    assert await store.claim_keys("w1", lanes=[None]) == ["plain"]
    assert await store.claim_keys("w1", lanes=[None]) == []  # the keyed task is not in lane None
    assert await store.claim_keys("w1", lanes=["other"]) == []
    assert await store.claim_keys("w1", lanes=["acme"]) == ["a1"]


async def test_a_targeted_task_with_a_key_carries_it_in_every_token(store: Store) -> None:
    await store.add("t", fair_key="acme", specific_worker_ids=["w1", "w2"], specific_groups=["g"])
    state = await store.state("t")
    assert state["claimers"] == [f"{NAME}#acme|w1", f"{NAME}#acme|w2", f"{NAME}#acme|g:g"]
    assert await store.claim_keys("w3", lanes=["acme"]) == []
    assert await store.claim_keys("w3", lanes=["acme"], groups=["g"]) == ["t"]


async def test_a_claim_round_deals_its_attempts_over_the_lanes_in_turn(store: Store) -> None:
    for i in range(5):
        await store.add(f"a{i}", fair_key="a")
    for i in range(2):
        await store.add(f"b{i}", fair_key="b")
    claimed = await store.claim("w1", 4, lanes=["a", "b"])
    lanes = sorted(c.lane or "" for c in claimed)
    assert lanes == ["a", "a", "b", "b"]
    assert {c.claim_priority for c in claimed} == {0}


async def test_a_lane_listed_twice_takes_two_turns(store: Store) -> None:
    for lane in ("a", "b"):
        for i in range(4):
            await store.add(f"{lane}{i}", fair_key=lane)
    claimed = await store.claim("w1", 3, lanes=["a", "a", "b"])
    assert sorted(c.lane or "" for c in claimed) == ["a", "a", "b"]


async def test_an_empty_lane_is_reported_and_its_attempts_go_to_the_others(store: Store) -> None:
    for i in range(3):
        await store.add(f"a{i}", fair_key="a")
    exhausted: list[str | None] = []
    claimed = await store.claim("w1", 3, lanes=["gone", "a", None], exhausted=exhausted)
    assert [c.lane for c in claimed] == ["a", "a", "a"]
    assert set(exhausted) == {"gone", None}


async def test_a_lane_not_visited_is_not_reported_empty(store: Store) -> None:
    await store.add("a0", fair_key="a")
    exhausted: list[str | None] = []
    assert await store.claim_keys("w1", 1, lanes=["a", "b"], exhausted=exhausted) == ["a0"]
    assert exhausted == []  # one attempt: lane b was not visited


async def test_find_lanes_lists_the_keys_of_claimable_tasks_of_the_names(store: Store) -> None:
    await store.add("a", fair_key="acme")
    await store.add("b", fair_key="beta", run_at=store.at(60))  # claimable later: listed
    await store.add("c", "other_name", fair_key="gamma")
    await store.add("d", fair_key="delta")
    await store.add("plain")
    (claimed,) = await store.claim("w1", lanes=["delta"])
    await store.done(claimed, "w1")  # finished: no longer listed
    lanes = await store.driver.find_lanes(LaneParams([NAME]))
    assert lanes == ["acme", "beta"]
    assert await store.driver.find_lanes(LaneParams([NAME, "other_name"], limit=2)) == ["acme", "beta"]
    assert await store.driver.find_lanes(LaneParams([NAME, "other_name"], after="acme")) == ["beta", "gamma"]


async def test_find_wakeups_reads_the_given_lanes_and_names_the_lane(store: Store) -> None:
    await store.add("a", fair_key="acme", run_at=store.at(10))
    await store.add("p", run_at=store.at(20))
    params = WakeupParams("w1", [NAME], store.now, lanes=[None, "acme"])
    found = {(w.key, w.lane) for w in await store.driver.find_wakeups(params) if w.kind == "claim"}
    assert found == {("a", "acme"), ("p", None)}
    plain = WakeupParams("w1", [NAME], store.now)
    assert {w.key for w in await store.driver.find_wakeups(plain) if w.kind == "claim"} == {"p"}


async def test_changing_the_fairness_key_moves_the_task_to_its_new_lane(store: Store) -> None:
    await store.add("a", fair_key="acme")
    doc = await store.driver.get_task("a")
    assert doc is not None
    await store.update_option("a", dict(doc["option"]) | {"fair_key": "beta"})
    assert await store.claim_keys("w1", lanes=["acme"]) == []
    assert await store.claim_keys("w1", lanes=["beta"]) == ["a"]


# -- aging ------------------------------------------------------------------------------------------

AGING = timedelta(seconds=10)


async def test_an_aging_task_is_ordered_by_its_due_time_moved_back_by_its_priority(store: Store) -> None:
    await store.add("p3", priority=3, aging=AGING)
    state = await store.state("p3")
    assert state["claim_priority"] == 0
    assert state["order_at"] == state["claim_at"] - 3 * AGING
    await store.add("p0", aging=AGING)
    state = await store.state("p0")
    assert (state["claim_priority"], state["order_at"]) == (0, state["claim_at"])
    await store.add("plain", priority=3)
    state = await store.state("plain")
    assert (state["claim_priority"], state["order_at"]) == (3, state["claim_at"])


@pytest.mark.global_claim_order
async def test_a_low_priority_task_that_waited_long_enough_goes_first(store: Store) -> None:
    await store.add("old_low", priority=0, aging=AGING)
    store.advance(31)  # more than 3 x aging later
    await store.add("new_high", priority=3, aging=AGING)
    assert await store.claim_keys("w1") == ["old_low"]


@pytest.mark.global_claim_order
async def test_a_higher_priority_task_goes_first_until_the_wait_makes_up_for_it(store: Store) -> None:
    await store.add("old_low", priority=0, aging=AGING)
    store.advance(29)  # less than 3 x aging later
    await store.add("new_high", priority=3, aging=AGING)
    assert await store.claim_keys("w1") == ["new_high"]


@pytest.mark.global_claim_order
async def test_aging_tasks_share_claim_priority_zero_with_other_tasks(store: Store) -> None:
    await store.add("aging", priority=5, aging=AGING)
    await store.add("plain_high", priority=1)
    await store.add("plain_low", priority=-1)
    assert await store.claim_keys("w1", 3) == ["plain_high", "aging", "plain_low"]


async def test_an_aging_task_is_not_claimed_before_it_is_due(store: Store) -> None:
    await store.add("later", priority=5, aging=AGING, run_at=store.at(20))  # order time in the past
    state = await store.state("later")
    assert state["order_at"] < store.now < state["claim_at"]
    assert await store.claim_keys("w1") == []
    store.advance(20)
    assert await store.claim_keys("w1") == ["later"]


# -- waits per key --------------------------------------------------------------------------------


async def test_key_waits_count_the_due_tasks_per_key_longest_wait_first(store: Store) -> None:
    await store.add("a1", fair_key="acme")
    store.advance(10)
    await store.add("a2", fair_key="acme")
    await store.add("b1", fair_key="beta")
    await store.add("b2", fair_key="beta", run_at=store.at(60))  # not due yet: not counted
    await store.add("c1", "other_name", fair_key="gamma")
    await store.add("plain")  # no key
    (claimed,) = await store.claim("w1", lanes=["beta"])  # running: no longer due
    store.advance(5)
    waits = await store.driver.key_waits(KeyWaitParams(store.now))
    assert [(w.key, w.due, w.oldest_wait) for w in waits] == [("acme", 2, 15.0), ("gamma", 1, 5.0)]
    named = await store.driver.key_waits(KeyWaitParams(store.now, names=[NAME], limit=5))
    assert [w.key for w in named] == ["acme"]
    assert [w.key for w in await store.driver.key_waits(KeyWaitParams(store.now, limit=1))] == ["acme"]
    await store.done(claimed, "w1")
    store.advance(60)  # b2 is due now
    waits = await store.driver.key_waits(KeyWaitParams(store.now))
    assert [(w.key, w.due) for w in waits] == [("acme", 2), ("gamma", 1), ("beta", 1)]
    assert waits[2].oldest_wait == 5.0
