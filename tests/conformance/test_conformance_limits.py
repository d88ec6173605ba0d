"""Flow limits (SPEC G5) on every driver: the limit document's slots and rate starts.

Every acquire and slot update is also checked against ``mscheduler.domain.limits.grant`` / ``settle``
applied to the document as it was before (the Mongo driver writes them as update pipelines).
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest

from mscheduler.domain.limits import Limit, Rate, grant, settle
from mscheduler.drivers.base import (
    AcquireParams,
    Driver,
    LimitNameTaken,
    LimitOfName,
    PutLimitParams,
    SlotsParams,
)
from mscheduler.testing.clock import FakeClock

LEASE = timedelta(seconds=30)


class Limits:
    def __init__(self, driver: Driver, clock: FakeClock) -> None:
        self.driver = driver
        self.clock = clock

    async def put(self, key: str, **fields: Any) -> bool:
        limit = Limit(key=key, **fields)
        return await self.driver.put_limit(PutLimitParams(key, limit.to_storage(), self.clock.now()))

    async def acquire(
        self, key: str, worker: str, *attempts: str, lease: timedelta = LEASE, release: tuple[str, ...] = ()
    ) -> list[str]:
        now = self.clock.now()
        before = await self.driver.get_limit(key)
        params = AcquireParams(key, worker, attempts, now, now + lease, release=release)
        result = await self.driver.acquire_slots(params)
        after = await self.driver.get_limit(key)
        if before is not None:
            assert after is not None
            expected = copy.deepcopy(before)
            grant(expected, worker, attempts, now, now + lease, release)
            assert after["slots"] == expected["slots"] and after["starts"] == expected["starts"]
            summary = ("live", "recent", "retry_ms", "starts_w")
            assert {f: after.get(f) for f in summary} == {f: expected.get(f) for f in summary}
        return result.granted

    async def update(self, key: str, worker: str, **changes: Any) -> list[str]:
        now = self.clock.now()
        before = await self.driver.get_limit(key)
        params = SlotsParams(key, worker, now, **changes)
        live = await self.driver.update_slots(params)
        after = await self.driver.get_limit(key)
        if before is not None:
            assert after is not None
            expected = copy.deepcopy(before)
            assert live == settle(expected, worker, now, params.extend, params.release, params.unused)
            assert after["slots"] == expected["slots"] and after["starts"] == expected["starts"]
        return live

    async def live(self, key: str) -> list[str]:
        doc = await self.driver.get_limit(key)
        assert doc is not None
        return sorted(a for a, s in doc["slots"].items() if s["e"] > self.clock.now())

    def advance(self, seconds: float) -> None:
        self.clock.advance(timedelta(seconds=seconds))


@pytest.fixture
def limits(driver: Driver, fake_clock: FakeClock) -> Limits:
    return Limits(driver, fake_clock)


async def test_put_get_list_delete(limits: Limits) -> None:
    assert await limits.put("api", names=("fetch", "push"), max_running=4) is True
    assert await limits.put("import", max_running=2, rate="10/s") is True
    assert await limits.put("api", names=("fetch", "push"), max_running=5) is False  # changed
    doc = await limits.driver.get_limit("api")
    assert doc is not None and doc["max_running"] == 5 and doc["names"] == ["fetch", "push"]
    assert [d["_id"] for d in await limits.driver.list_limits()] == ["api", "import"]
    imported = await limits.driver.get_limit("import")
    assert imported is not None and imported["rate_n"] == 10 and imported["rate_period_ms"] == 1000
    assert await limits.driver.limit_keys(["fetch", "import", "other"]) == {
        "fetch": LimitOfName("api", rated=False),
        "import": LimitOfName("import", rated=True),  # the limit has a rate
    }
    assert await limits.driver.delete_limit("api") is True
    assert await limits.driver.delete_limit("api") is False
    assert await limits.driver.limit_keys(["fetch"]) == {}


async def test_a_name_belongs_to_one_limit(limits: Limits) -> None:
    await limits.put("api", names=("fetch",), max_running=1)
    with pytest.raises(LimitNameTaken) as caught:
        await limits.put("other", names=("push", "fetch"), max_running=1)
    assert caught.value.holder == "api"
    assert await limits.driver.get_limit("other") is None
    # the limit itself may change its names
    await limits.put("api", names=("push",), max_running=1)
    await limits.put("other", names=("fetch",), max_running=1)
    assert await limits.driver.limit_keys(["fetch", "push"]) == {
        "fetch": LimitOfName("other"),
        "push": LimitOfName("api"),
    }


async def test_slots_up_to_max_running_then_refused(limits: Limits) -> None:
    await limits.put("job", max_running=3)
    assert await limits.acquire("job", "w1", "a1", "a2") == ["a1", "a2"]
    assert await limits.acquire("job", "w2", "b1", "b2") == ["b1"]
    assert await limits.acquire("job", "w3", "c1") == []
    assert await limits.live("job") == ["a1", "a2", "b1"]


async def test_a_retried_acquire_is_not_counted_twice(limits: Limits) -> None:
    await limits.put("job", max_running=2, rate="5/s")
    assert await limits.acquire("job", "w1", "a1") == ["a1"]
    assert await limits.acquire("job", "w1", "a1") == ["a1"]  # the same request again (lost reply)
    doc = await limits.driver.get_limit("job")
    assert doc is not None and len(doc["slots"]) == 1 and sum(doc["starts"].values()) == 1
    assert await limits.acquire("job", "w2", "b1") == ["b1"]


async def test_an_expired_slot_comes_back_at_its_expiry_not_before(limits: Limits) -> None:
    await limits.put("job", max_running=1)
    assert await limits.acquire("job", "w1", "a1", lease=timedelta(seconds=10)) == ["a1"]
    limits.advance(9.999)
    assert await limits.acquire("job", "w2", "b1") == []
    limits.advance(0.001)
    assert await limits.acquire("job", "w2", "b1") == ["b1"]
    # the dead holder cannot revive its slot
    assert await limits.update("job", "w1", extend={"a1": limits.clock.now() + LEASE}) == []
    assert await limits.live("job") == ["b1"]


async def test_held_slots_name_the_limit_of_each_live_slot_of_the_worker(limits: Limits) -> None:
    """The store's record of who holds which slot: what an API server that did not acquire a
    slot reads to extend or release it."""
    await limits.put("api", names=("fetch", "push"), max_running=5)
    await limits.put("import", max_running=5)
    assert await limits.acquire("api", "w1", "a1", "a2") == ["a1", "a2"]
    assert await limits.acquire("import", "w1", "b1", lease=timedelta(seconds=10)) == ["b1"]
    assert await limits.acquire("import", "w2", "c1") == ["c1"]
    now = limits.clock.now()
    asked = ["a1", "a2", "b1", "c1", "never"]
    assert await limits.driver.held_slots("w1", asked, now) == {"a1": "api", "a2": "api", "b1": "import"}
    assert await limits.driver.held_slots("w2", asked, now) == {"c1": "import"}  # owner-fenced
    await limits.update("api", "w1", release=["a2"])
    limits.advance(10)  # b1's slot expires
    assert await limits.driver.held_slots("w1", asked, limits.clock.now()) == {"a1": "api"}
    assert await limits.driver.held_slots("w1", ["never"], limits.clock.now()) == {}


async def test_release_extend_and_unused(limits: Limits) -> None:
    await limits.put("job", max_running=2, rate="100/s")
    assert await limits.acquire("job", "w1", "a1", "a2") == ["a1", "a2"]
    later = limits.clock.now() + timedelta(seconds=60)
    assert await limits.update("job", "w1", extend={"a1": later}, unused=["a2"]) == ["a1"]
    doc = await limits.driver.get_limit("job")
    assert doc is not None and list(doc["slots"]) == ["a1"]
    assert sum(doc["starts"].values()) == 1  # a2 never started: its start given back
    # another worker cannot release or extend our slot
    assert await limits.update("job", "w2", extend={"a1": later}, release=["a1"]) == []
    assert await limits.live("job") == ["a1"]
    limits.advance(45)  # past the first lease, before the extended one
    assert await limits.live("job") == ["a1"]
    assert await limits.update("job", "w1", release=["a1"]) == []
    assert await limits.live("job") == []
    assert await limits.update("job", "w1", release=["a1"]) == []  # idempotent


async def test_rate_is_a_sliding_window(limits: Limits) -> None:
    await limits.put("job", rate=Rate(n=3, period=timedelta(seconds=1)))
    assert await limits.acquire("job", "w1", "a1", "a2") == ["a1", "a2"]
    limits.advance(0.5)
    assert await limits.acquire("job", "w2", "b1", "b2") == ["b1"]
    now = limits.clock.now()
    result = await limits.driver.acquire_slots(AcquireParams("job", "w3", ["c1"], now, now + LEASE))
    assert result.granted == [] and result.retry_at == now + timedelta(seconds=0.5)
    # releasing a slot does not give back a start: the start happened
    await limits.update("job", "w1", release=["a1", "a2"])
    assert await limits.acquire("job", "w3", "c2") == []
    limits.advance(0.5)  # a1, a2 leave the window
    assert await limits.acquire("job", "w3", "c3", "c4", "c5") == ["c3", "c4"]


async def test_an_acquire_releases_the_ended_slots_of_its_worker_in_the_same_write(limits: Limits) -> None:
    """``AcquireParams.release``: the slots of this worker's ended attempts go first (they count
    as free for this grant), another worker's are left alone, and their starts stay counted."""
    await limits.put("job", max_running=2, rate="3/h")
    assert await limits.acquire("job", "w1", "a1", "a2") == ["a1", "a2"]
    assert await limits.acquire("job", "w2", "b1") == []  # full
    assert await limits.acquire("job", "w2", "b1", release=("a1",)) == []  # not w2's slot
    assert await limits.live("job") == ["a1", "a2"]
    assert await limits.acquire("job", "w1", "a3", "a4", release=("a1",)) == ["a3"]
    assert await limits.live("job") == ["a2", "a3"]
    # the rate: a1's start stays counted (3 starts in the hour)
    assert await limits.acquire("job", "w1", "a5", release=("a2", "a3")) == []
    assert await limits.live("job") == []


async def test_a_rate_added_later_counts_the_slots_granted_before_it(limits: Limits) -> None:
    """A slot granted while the limit had no rate carries no start; a grant reserved then may be
    used later without a write (``Consumer(limit_reserve=True)``). Once a rate is set, each
    such slot counts as a start while it is in the document, and its start is counted when it
    leaves (released, expired), so that no window of the rate misses it; an unused one never
    started."""
    await limits.put("job", max_running=10)
    assert await limits.acquire("job", "w1", "a1", "a2", "a3") == ["a1", "a2", "a3"]
    await limits.put("job", max_running=10, rate="3/h")
    assert await limits.acquire("job", "w2", "b1") == []  # a1..a3 may start (or have) in this hour
    await limits.update("job", "w1", release=["a1"])  # ended: kept until the next acquire counts it
    assert await limits.live("job") == ["a2", "a3"]
    assert await limits.acquire("job", "w2", "b1") == []  # a1's start now in a bucket
    doc = await limits.driver.get_limit("job")
    assert doc is not None and sum(doc["starts"].values()) == 1 and sorted(doc["slots"]) == ["a2", "a3"]
    await limits.update("job", "w1", unused=["a2"])  # never started: no start
    assert await limits.acquire("job", "w2", "b1", "b2", lease=timedelta(hours=2)) == ["b1"]  # a1, a3, b1
    limits.advance(31)  # a3 expires (its start counted when the next acquire drops it)
    assert await limits.acquire("job", "w2", "b2") == []
    doc = await limits.driver.get_limit("job")
    assert doc is not None and sum(doc["starts"].values()) == 3 and sorted(doc["slots"]) == ["b1"]
    limits.advance(3600)
    assert await limits.acquire("job", "w2", "b3", release=("b1",)) == ["b3"]


async def test_lowering_max_running_grants_nothing_until_below(limits: Limits) -> None:
    await limits.put("job", max_running=3)
    assert await limits.acquire("job", "w1", "a1", "a2", "a3") == ["a1", "a2", "a3"]
    await limits.put("job", max_running=1)
    await limits.update("job", "w1", release=["a1"])
    assert await limits.acquire("job", "w2", "b1") == []
    await limits.update("job", "w1", release=["a2", "a3"])
    assert await limits.acquire("job", "w2", "b1", "b2") == ["b1"]


async def test_max_running_zero_holds_the_names_back(limits: Limits) -> None:
    await limits.put("job", max_running=0)
    assert await limits.acquire("job", "w1", "a1") == []


async def test_no_limit_means_everything_is_granted(limits: Limits) -> None:
    now = limits.clock.now()
    result = await limits.driver.acquire_slots(AcquireParams("job", "w1", ["a1", "a2"], now, now + LEASE))
    assert result.limited is False and result.granted == ["a1", "a2"]
    assert await limits.driver.update_slots(SlotsParams("job", "w1", now, extend={"a1": now})) == ["a1"]


async def test_operations_validate_and_report(driver: Driver, fake_clock: FakeClock) -> None:
    from mscheduler import InvalidInput, Operations
    from mscheduler.domain.exceptions import UnknownLimit

    ops = Operations(driver, clock=fake_clock)
    info = await ops.set_limit("api", names=["fetch", "push"], max_running=4, rate="1000/h")
    assert info.limit.names == ("fetch", "push")
    assert info.limit.rate == Rate(n=1000, period=timedelta(hours=1))
    assert info.running == 0 and info.recent_starts == 0
    bad: list[dict[str, Any]] = [
        {},  # neither max_running nor rate
        {"max_running": -1},
        {"rate": "ten per second"},
        {"rate": "0/s"},
        {"rate": "5/8d"},  # longer than 7 days
        {"max_running": 1, "names": "fetch"},  # a string, not a list
        {"max_running": 1, "names": ["a|b"]},
        {"max_running": 1, "names": ["x", "x"]},
        {"max_running": 1, "names": ["push"]},  # covered by "api"
    ]
    for fields in bad:
        with pytest.raises(InvalidInput):
            await ops.set_limit("other", **fields)
    with pytest.raises(InvalidInput):
        await ops.set_limit("$bad", max_running=1)
    assert [i.limit.key for i in await ops.list_limits()] == ["api"]
    now = fake_clock.now()
    await driver.acquire_slots(AcquireParams("api", "w1", ["a1"], now, now + LEASE))
    info = await ops.get_limit("api")
    assert info.running == 1 and info.recent_starts == 1 and info.holders == (("w1", "a1", now + LEASE),)
    await ops.remove_limit("api")
    with pytest.raises(UnknownLimit):
        await ops.get_limit("api")
    with pytest.raises(UnknownLimit):
        await ops.remove_limit("api")
