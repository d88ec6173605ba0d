"""Targeting by group (SPEC F31) and dispatch counts (SPEC F33) on every driver.

A task names workers, groups or both (``specific_worker_ids``, ``specific_groups``): a worker may
claim it if it is named or a member of a named group. Groups become claimer tokens
``<name>|g:<group>``, so the claim stays an equality on the claim index's first field (tasks aimed
at groups the worker is not in are outside its ranges). ``same_worker_may_repeat``: a worker may
take the task again after its run, until ``concurrent_worker_cnt`` runs succeeded.
"""

from __future__ import annotations

import pytest

from mscheduler.domain.model import TaskOption
from mscheduler.drivers.base import WakeupParams
from tests.conformance.support import Store


async def test_claimers_of_each_targeting_combination(store: Store) -> None:
    await store.add("anyone")
    await store.add("workers", specific_worker_ids=("w1",))
    await store.add("groups", specific_groups=("gpu", "eu"))
    await store.add("both", specific_worker_ids=("w1",), specific_groups=("gpu",))
    claimers = {t["key"]: t["state"]["claimers"] for t in await store.all_tasks()}
    assert claimers == {
        "anyone": ["job|*"],
        "workers": ["job|w1"],
        "groups": ["job|g:gpu", "job|g:eu"],
        "both": ["job|w1", "job|g:gpu"],
    }
    targeted = {t["key"]: t["state"]["targeted"] for t in await store.all_tasks()}
    assert targeted == {"anyone": False, "workers": True, "groups": True, "both": True}


@pytest.mark.parametrize(
    ("worker", "groups", "expected"),
    [
        ("w1", (), {"anyone", "workers", "both"}),
        ("w2", ("gpu",), {"anyone", "groups", "both"}),
        ("w3", ("eu",), {"anyone", "groups"}),
        ("w4", ("absent",), {"anyone"}),  # a group no task names
        ("w5", (), {"anyone"}),
    ],
)
async def test_who_claims_what(
    store: Store, worker: str, groups: tuple[str, ...], expected: set[str]
) -> None:
    await store.add("anyone")
    await store.add("workers", specific_worker_ids=("w1",))
    await store.add("groups", specific_groups=("gpu", "eu"))
    await store.add("both", specific_worker_ids=("w1",), specific_groups=("gpu",))
    wakeups = await store.driver.find_wakeups(WakeupParams(worker, ["job"], store.now, groups=groups))
    assert {w.key for w in wakeups} == expected
    assert set(await store.claim_keys(worker, 10, groups=groups)) == expected


async def test_a_task_for_an_absent_group_waits(store: Store) -> None:
    await store.add("t", specific_groups=("nobody-here",))
    assert await store.claim_keys("w1", groups=("gpu",)) == []
    await store.change_option("t", specific_groups=("gpu",))  # live change (F8)
    assert await store.claim_keys("w1", groups=("gpu",)) == ["t"]


async def test_removing_the_group_revokes_its_running_members(store: Store) -> None:
    await store.add("t", specific_groups=("gpu",))
    claimed = await store.claim_one("w1", groups=("gpu",))
    assert claimed is not None
    result = await store.ping("w1", {"t": claimed.attempt}, groups=("gpu",))
    assert list(result.alive) == ["t"]
    await store.change_option("t", specific_groups=("cpu",))
    result = await store.ping("w1", {"t": claimed.attempt}, groups=("gpu",))
    assert result.revoked == ["t"]
    # a worker named as well as its group stays allowed
    await store.change_option("t", specific_worker_ids=("w1",), specific_groups=("cpu",))
    result = await store.ping("w1", {"t": claimed.attempt}, groups=("gpu",))
    assert list(result.alive) == ["t"]


async def test_n_distinct_members_of_a_group(store: Store) -> None:
    """Seed 002's dispatch count without repeats: 2 dispatches to group members, first come first
    served, each member once."""
    await store.add("t", specific_groups=("team",), concurrent_worker_cnt=2)
    a = await store.claim_one("a", groups=("team",))
    assert a is not None and await store.claim_keys("x") == []  # not a member
    b = await store.claim_one("b", groups=("team",))
    assert b is not None and await store.claim_keys("c", groups=("team",)) == []  # both dispatched
    assert await store.done(a, "a")
    assert await store.claim_keys("a", groups=("team",)) == []  # no second run by a
    assert await store.done(b, "b")
    assert await store.status("t") == "succeeded"


async def test_same_worker_may_repeat_until_the_count_is_used(store: Store) -> None:
    """The blocking variant: a member takes it again after its run until 3 runs succeeded; never
    two runs of one worker at once."""
    await store.add("t", specific_groups=("team",), concurrent_worker_cnt=3, same_worker_may_repeat=True)
    first = await store.claim_one("a", groups=("team",))
    assert first is not None
    assert await store.claim_keys("a", groups=("team",)) == []  # running already
    assert await store.done(first, "a")
    second = await store.claim_one("a", groups=("team",))
    assert second is not None and second.attempt_no == 2
    other = await store.claim_one("b", groups=("team",))
    assert other is not None
    assert await store.done(second, "a") and await store.done(other, "b")
    assert await store.status("t") == "succeeded"
    assert await store.claim_keys("a", groups=("team",)) == []
    workers = [e["worker_id"] for e in await store.entries("t")]
    assert workers == ["a", "a", "b"]


async def test_repeat_on_an_untargeted_task(store: Store) -> None:
    await store.add("t", concurrent_worker_cnt=2, same_worker_may_repeat=True)
    first = await store.claim_one("a")
    assert first is not None and await store.done(first, "a")
    again = await store.claim_one("a")
    assert again is not None and await store.done(again, "a")
    assert await store.status("t") == "succeeded"


def test_option_rules() -> None:
    with pytest.raises(ValueError):
        TaskOption(specific_groups=("a|b",))
    with pytest.raises(ValueError):
        TaskOption(specific_worker_ids=("g:gpu",))  # would read as the group's token
    with pytest.raises(ValueError):  # 2 distinct named workers cannot make 3 runs...
        TaskOption(specific_worker_ids=("a", "b"), concurrent_worker_cnt=3)
    TaskOption(
        specific_worker_ids=("a", "b"), concurrent_worker_cnt=3, same_worker_may_repeat=True
    )  # ...repeats can
    TaskOption(
        specific_worker_ids=("a",), specific_groups=("g",), concurrent_worker_cnt=3
    )  # a group may be large
