"""Partitions (issue 18.9 / 18.10) on every driver and store (1 and 4 partitions): a task lives in
the partition of its key; a claim names the partitions it visits and takes from them only, in the
claim order within each; a claimer visiting the partitions with work from a random start starves
none of them, however skewed the load."""

from __future__ import annotations

import random
from collections import Counter

from mscheduler.domain.partitions import part_of, visit_order
from mscheduler.drivers.base import ClaimParams
from tests.conformance.support import NAME, Store


def keys_in(part: int, n: int, partitions: int, prefix: str = "k") -> list[str]:
    """``n`` keys whose partition is ``part``."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        key = f"{prefix}{i}"
        if part_of(key, partitions) == part:
            found.append(key)
        i += 1
    return found


async def test_every_task_is_stored_in_the_partition_of_its_key(store: Store) -> None:
    partitions = store.driver.partitions
    for i in range(20):
        await store.add(f"t{i}")
    for i in range(20):
        assert (await store.get(f"t{i}"))["part"] == part_of(f"t{i}", partitions)


async def test_a_claim_takes_from_the_partitions_it_names_in_the_claim_order_within_each(
    store: Store,
) -> None:
    partitions = store.driver.partitions
    last = partitions - 1
    low, high = keys_in(last, 2, partitions, "low"), keys_in(last, 1, partitions, "high")
    await store.add(low[0], priority=0)
    await store.add(high[0], priority=5)
    store.advance(1)
    await store.add(low[1], priority=0)
    # higher priorities in the other partitions (none when the store has one)
    for key in [k for k in keys_in(0, 3, partitions, "other") if part_of(k, partitions) != last]:
        await store.add(key, priority=9)
    params = ClaimParams("w1", [NAME], store.now, ["a1", "a2", "a3"], parts=[last])
    claimed = [c.key for c in await store.driver.claim(params)]
    await store.check_all()
    assert claimed == [high[0], low[0], low[1]], "its partition only, in the claim order"


async def test_no_partition_starves_when_one_holds_nine_tenths_of_the_tasks(store: Store) -> None:
    """The sharding benchmark's check at the conformance level: 90 tasks in partition 0 and 10
    spread over the rest; a claimer taking one task per claim, visiting the partitions with work
    from a random start, has claimed from every partition within its first rounds."""
    partitions = store.driver.partitions
    hot = keys_in(0, 90, partitions, "hot")
    cold = [
        key
        for part in range(1, partitions)
        for key in keys_in(part, 10 // max(partitions - 1, 1), partitions, f"c{part}-")
    ]
    for key in hot + cold:
        await store.add(key)
    rng = random.Random(7)
    first_claim: dict[int, int] = {}
    counts: Counter[int] = Counter()
    for n in range(40):
        with_work = {
            part_of(t["key"], partitions)
            for t in await store.all_tasks()
            if t["state"]["status"] == "pending"
        }
        params = ClaimParams(
            "w1", [NAME], store.now, [f"a{n}"], parts=visit_order(partitions, with_work, rng)
        )
        (claimed,) = await store.driver.claim(params)
        part = part_of(claimed.key, partitions)
        counts[part] += 1
        first_claim.setdefault(part, n)
    await store.check_all()
    assert set(first_claim) == set(range(partitions)), f"a partition was never visited: {counts}"
    assert max(first_claim.values()) < 4 * partitions, f"a partition waited too long: {first_claim}"
