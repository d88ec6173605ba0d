"""Who may claim (``state.claimers``) and the first lease (issue 6, A1 and A3), on every driver."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from mscheduler.domain.model import TaskOption
from mscheduler.drivers.base import ClaimParams, InsertParams, NewTask, WakeupParams
from mscheduler.drivers.memory.driver import MemoryDriver
from tests.conformance.support import NAME, Store


async def test_the_first_lease_is_the_tasks_own_worker_timeout(store: Store) -> None:
    """Not a consumer-wide 30 s: a worker that dies right after claiming a task whose
    worker_timeout is 0.5 s blocks it for 0.5 s (F4)."""
    await store.add(
        "short", worker_timeout=timedelta(milliseconds=500), ping_interval=timedelta(milliseconds=100)
    )
    (claimed,) = await store.claim("w1", lease=timedelta(hours=1))  # the cap is above the timeout
    assert claimed.ping_expire_time == store.now + timedelta(milliseconds=500)
    (entry,) = await store.entries("short")
    assert entry["ping_expire_time"] == store.now + timedelta(milliseconds=500)
    store.advance(0.5)
    assert await store.expire() == 1
    assert await store.claim_keys("w2") == ["short"]


async def test_a_claims_cap_shortens_the_first_lease(store: Store) -> None:
    await store.add("long", worker_timeout=timedelta(minutes=10))
    (claimed,) = await store.claim("w1", lease=timedelta(seconds=20))
    assert claimed.ping_expire_time == store.now + timedelta(seconds=20)
    (entry,) = await store.entries("long")
    assert entry["ping_expire_time"] == store.now + timedelta(seconds=20)


@pytest.mark.global_claim_order
async def test_claimers_name_the_workers_that_may_claim_now(store: Store) -> None:
    await store.add("open")
    await store.add("aimed", specific_worker_ids=("A", "B"))
    await store.add("fan", specific_worker_ids=("A", "B", "C"), concurrent_worker_cnt=2)
    assert (await store.state("open"))["claimers"] == [f"{NAME}|*"]
    assert (await store.state("aimed"))["claimers"] == [f"{NAME}|A", f"{NAME}|B"]
    (claimed,) = await store.claim("A", names=[NAME])
    assert claimed.key in ("aimed", "fan", "open")
    # A holds one task now; each task A may still take lists A, the one it holds does not
    held = await store.state(claimed.key)
    assert all(not token.endswith("|A") for token in held["claimers"])
    fan_claim = await store.claim_one("B")
    assert fan_claim is not None
    fan = await store.state("fan")
    if claimed.key == "fan":  # A and B both run it: its two slots are full
        assert fan["claimers"] == []
    # a task aimed at others is not in C's ranges, an open task is
    await store.add("only-d", specific_worker_ids=("D",))
    assert "only-d" not in await store.claim_keys("C", 5)


async def test_a_failed_attempt_makes_the_task_claimable_again_by_the_same_worker(store: Store) -> None:
    await store.add("t", specific_worker_ids=("A",))
    (claimed,) = await store.claim("A")
    assert (await store.state("t"))["claimers"] == []
    assert await store.fail(claimed, "A", retry_in=5)
    state = await store.state("t")
    assert state["claimers"] == [f"{NAME}|A"] and state["claim_at"] == store.at(5)


async def test_a_claim_examines_no_task_aimed_at_other_workers() -> None:
    """The memory driver counts the documents a claim looks at (MongoDB's docsExamined):
    5,000 due tasks aimed at an absent worker do not add to it."""
    driver = MemoryDriver()
    from datetime import UTC, datetime

    now = datetime(2030, 1, 1, tzinfo=UTC)
    aimed = TaskOption(specific_worker_ids=("absent",)).to_storage(now)
    anyone = TaskOption().to_storage(now)
    tasks = [NewTask(f"t{i}", NAME, None, aimed) for i in range(5000)]
    tasks += [NewTask(f"f{i}", NAME, None, anyone) for i in range(5)]
    await driver.insert_tasks(InsertParams(tasks, now))
    driver.examined = 0
    claimed = []
    for i in range(5):
        claimed += await driver.claim(ClaimParams("w1", [NAME], now, [f"a{i}"]))
    assert sorted(c.key for c in claimed) == [f"f{i}" for i in range(5)]
    assert driver.examined == 5
    assert await driver.claim(ClaimParams("w1", [NAME], now, ["a9"])) == []
    driver.examined = 0
    wakeups = await driver.find_wakeups(WakeupParams("w1", [NAME], now, limit=100))
    assert [w for w in wakeups if w.kind == "claim"] == []
    assert driver.examined == 0


async def test_fan_out_tasks_this_worker_ran_are_skipped_by_key_without_being_examined() -> None:
    """An untargeted fan-out task keeps ``name|*`` while a slot is free, even for the worker that
    ran it; the consumer sends the keys of those it ran (exclude_keys), which the store checks on
    the claim index's keys: they are not fetched (examined) by later claims."""
    from datetime import UTC, datetime

    from mscheduler.drivers.base import FinishParams

    driver = MemoryDriver()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    fan = TaskOption(concurrent_worker_cnt=2, priority=5).to_storage(now)
    await driver.insert_tasks(InsertParams([NewTask(f"fan{i}", NAME, None, fan) for i in range(300)], now))
    ran = []
    for i in range(300):
        (claimed,) = await driver.claim(ClaimParams("w1", [NAME], now, [f"r{i}"]))
        ran.append(claimed)
    done = [FinishParams(c.key, "w1", c.attempt, now, "succeeded") for c in ran]
    assert all(await driver.finish(done))
    anyone = TaskOption().to_storage(now)
    await driver.insert_tasks(InsertParams([NewTask(f"free{i}", NAME, None, anyone) for i in range(3)], now))
    ran_keys = [c.key for c in ran]
    driver.examined = 0
    (claimed,) = await driver.claim(ClaimParams("w1", [NAME], now, ["x1"], exclude_keys=ran_keys))
    assert claimed.key.startswith("free") and driver.examined == 1
    driver.examined = 0
    (claimed,) = await driver.claim(ClaimParams("w1", [NAME], now, ["x2"]))  # without the keys
    assert claimed.key.startswith("free") and driver.examined == 301  # the residual check, each


async def test_a_consumer_remembers_the_fan_out_tasks_it_ran() -> None:
    from mscheduler import Consumer, FakeClock, Publisher, Task

    clock = FakeClock()
    driver = MemoryDriver(clock=clock)
    consumer = Consumer(driver, worker_id="w1", clock=clock, planner=False)
    finished = []
    consumer.add_listener(lambda event, data: finished.append(data["key"]) if event == "finished" else None)

    async def work(params: object) -> str:
        return "ok"

    consumer.register(NAME, work)
    await Publisher(driver, clock=clock).send_many(
        [Task(f"fan{i}", NAME, option=TaskOption(concurrent_worker_cnt=2)) for i in range(5)]
        + [Task("solo", NAME)]
    )
    async with consumer:
        for _ in range(200):
            if len(finished) >= 6:
                break
            await asyncio.sleep(0)
            clock.advance(0.05)
    assert sorted(consumer._ran_fanout) == [f"fan{i}" for i in range(5)]


@pytest.mark.global_claim_order
async def test_a_worker_of_three_hundred_names_claims_in_the_claim_order(store: Store) -> None:
    """18.4: 300 names (600 claimer tokens: more ranges than a server query merges) claim and
    poll like a worker of a few: priority first, aimed-at-me first, due time, across all names."""
    names = [f"n{i:03}" for i in range(300)]
    await store.add("low-early", "n010", priority=0)
    store.advance(1)
    await store.add("high", "n250", priority=5)
    await store.add("aimed", "n299", priority=5, specific_worker_ids=("w1",))
    await store.add("low-late", "n000", priority=0)
    await store.add("other", "not-mine", priority=9)
    wakeups = await store.driver.find_wakeups(WakeupParams("w1", names, store.now, 100))
    assert {w.key for w in wakeups} == {"low-early", "high", "aimed", "low-late"}
    assert await store.claim_keys("w1", 1, names=names) == ["aimed"]
    assert await store.claim_keys("w1", 2, names=names) == ["high", "low-early"]
    assert await store.claim_keys("w1", 5, names=names) == ["low-late"]
