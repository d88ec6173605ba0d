"""The Mongo update pipelines equal the Python ``derive``: random operations, two drivers, one clock.

Hypothesis draws a sequence of operations (insert, claim, ping, finish, expire, option change,
time steps). The same sequence is applied to a ``MemoryDriver`` and to a ``MongoDriver`` on
mongomock with the same fake times and attempt tokens; after every step both must answer the same
and hold identical task documents, whose derived fields equal ``mscheduler.domain.state.derive``.

Each task has its own priority, so the claim order is fully determined: the order among equal
tasks is not part of the contract, and a tie would make the stores diverge for no fault.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mscheduler.domain.listing import ListParams
from mscheduler.drivers.base import (
    ClaimParams,
    Driver,
    ExpireParams,
    FinishParams,
    InsertParams,
    NewTask,
    PingParams,
    UpdateOptionParams,
    WakeupParams,
)
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.clock import FakeClock
from mscheduler.testing.mongomock import mongomock_database
from tests.conformance.support import assert_derived, stored_option

KEYS = ("k0", "k1", "k2", "k3")
NAMES = {"k0": "job", "k1": "job", "k2": "other", "k3": "job"}
WORKERS = ("w0", "w1", "w2")
NAME_SETS = (["job"], ["job", "other"], ["other"])
OUTCOMES = ("succeeded", "failed", "released", "revoked", "rejected")
OPTION_VARIANTS: tuple[dict[str, Any], ...] = (
    {},
    {"concurrent_worker_cnt": 2, "max_unexpected_retries": 1},
    {"specific_worker_ids": ("w0", "w1")},
    {"run_at_in": 10},
    {"concurrent_worker_cnt": 3, "max_unexpected_retries": 0},
)
CHANGES: tuple[dict[str, Any], ...] = (
    {"priority_bump": 10},
    {"specific_worker_ids": ["w1"]},
    {"specific_worker_ids": []},
    {"max_unexpected_retries": 0},
    {"concurrent_worker_cnt": 2},
    {"run_at_in": 5},
    {"ping_interval_ms": 1000, "worker_timeout_ms": 4000},
)

_BUILDERS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "insert": st.tuples(
        st.just("insert"), st.sampled_from(KEYS), st.integers(0, len(OPTION_VARIANTS) - 1), st.booleans()
    ),
    "claim": st.tuples(
        st.just("claim"), st.sampled_from(WORKERS), st.integers(1, 3), st.integers(0, len(NAME_SETS) - 1)
    ),
    "ping": st.tuples(st.just("ping"), st.sampled_from(WORKERS), st.sampled_from([5, 30])),
    "finish": st.tuples(
        st.just("finish"),
        st.sampled_from(WORKERS),
        st.integers(0, 7),
        st.sampled_from(OUTCOMES),
        st.sampled_from([None, 0, 5, 20]),
        st.sampled_from([False, False, False, True]),  # forged token now and then
    ),
    "expire": st.tuples(st.just("expire")),
    "advance": st.tuples(st.just("advance"), st.sampled_from([0.001, 1, 4, 12, 31])),
    "option": st.tuples(st.just("option"), st.sampled_from(KEYS), st.integers(0, len(CHANGES) - 1)),
}
# weighted so that most runs reach every status: claims and finishes are the busy part
_KINDS = ["claim"] * 4 + ["finish"] * 5 + ["ping"] * 2 + ["advance"] * 2 + ["expire", "insert", "option"]
operation = st.sampled_from(_KINDS).flatmap(lambda kind: _BUILDERS[kind])


def _new_task(key: str, variant: int, clock: FakeClock, generation: int) -> NewTask:
    option = dict(OPTION_VARIANTS[variant])
    run_at_in = option.pop("run_at_in", None)
    if run_at_in is not None:
        option["run_at"] = clock.now() + timedelta(seconds=run_at_in)
    option["priority"] = KEYS.index(key)  # distinct priorities: a total claim order
    return NewTask(
        key, NAMES[key], {"key": key, "generation": generation}, stored_option(clock.now(), **option)
    )


def _changed(option: dict[str, Any], change: dict[str, Any], key: str, clock: FakeClock) -> dict[str, Any]:
    new = dict(option)
    for field, value in change.items():
        if field == "priority_bump":
            new["priority"] = KEYS.index(key) + value
        elif field == "run_at_in":
            new["run_at"] = clock.now() + timedelta(seconds=value)
        else:
            new[field] = value
    return new


class Lockstep:
    def __init__(self, memory: Driver, mongo: Driver, clock: FakeClock) -> None:
        self.drivers = (memory, mongo)
        self.clock = clock
        self.held: dict[str, list[tuple[str, str]]] = {w: [] for w in WORKERS}
        self.tokens = 0
        self.generation = 0

    async def both(self, call: Any) -> Any:
        memory_answer = await call(self.drivers[0])
        mongo_answer = await call(self.drivers[1])
        assert memory_answer == mongo_answer
        return memory_answer

    async def compare_stores(self) -> None:
        params = ListParams(limit=1000)
        memory_docs = await self.drivers[0].list_tasks(params)
        mongo_docs = await self.drivers[1].list_tasks(params)
        assert memory_docs == mongo_docs
        for doc in memory_docs:
            assert_derived(doc)
        counts = [await d.count_by_status() for d in self.drivers]
        assert counts[0] == counts[1]
        for worker in WORKERS:
            wakeups = WakeupParams(worker, ["job", "other"], self.clock.now(), 100)
            found = [await d.find_wakeups(wakeups) for d in self.drivers]
            claim_times = [{(w.key, w.time) for w in ws if w.kind == "claim"} for ws in found]
            assert claim_times[0] == claim_times[1]

    async def apply(self, op: tuple[Any, ...]) -> None:
        now = self.clock.now()
        kind = op[0]
        if kind == "insert":
            _, key, variant, reset = op
            self.generation += 1
            task = _new_task(key, variant, self.clock, self.generation)
            await self.both(lambda d: d.insert_tasks(InsertParams([task], now, reset)))
        elif kind == "claim":
            _, worker, n, names = op
            attempts = [f"{worker}#{self.tokens + i}" for i in range(n)]
            self.tokens += n
            params = ClaimParams(worker, NAME_SETS[names], now, attempts, timedelta(seconds=30))
            claimed = await self.both(lambda d: d.claim(params))
            self.held[worker].extend((c.key, c.attempt) for c in claimed)
        elif kind == "ping":
            _, worker, lease = op
            attempts = dict(self.held[worker])  # the latest attempt per key
            if attempts:
                params = PingParams(worker, now, {now + timedelta(seconds=lease): attempts})
                result = await self.both(lambda d: _ping_answer(d, params))
                assert set(result[0]) | set(result[1]) | set(result[2]) == set(attempts)
        elif kind == "finish":
            _, worker, pick, outcome, retry_in, forged = op
            held = self.held[worker]
            if held:
                key, attempt = held[pick % len(held)]
                retry_at = now + timedelta(seconds=retry_in) if retry_in is not None else None
                error = (
                    None if outcome == "succeeded" else {"type": "E", "message": outcome, "traceback": None}
                )
                result = {"by": worker} if outcome == "succeeded" else None
                token = attempt + "-forged" if forged else attempt
                item = FinishParams(key, worker, token, now, outcome, result, error, retry_at)
                (accepted,) = await self.both(lambda d: d.finish([item]))
                assert not (forged and accepted)
                # finished attempts stay in ``held``: finishing them again must be refused the
                # same way (or, repeated identically in the same millisecond, accepted as a retry)
        elif kind == "expire":
            await self.both(lambda d: d.expire_leases(ExpireParams(now)))
        elif kind == "advance":
            self.clock.advance(timedelta(seconds=op[1]))
        elif kind == "option":
            _, key, change = op
            doc = await self.drivers[0].get_task(key)
            option = _changed(doc["option"], CHANGES[change], key, self.clock) if doc else {}
            if doc is not None:
                params = UpdateOptionParams(key, option, now)
                assert await self.both(lambda d: d.update_option(params)) is True
        await self.compare_stores()


async def _ping_answer(driver: Driver, params: PingParams) -> tuple[list[str], list[str], list[str]]:
    result = await driver.ping(params)
    return sorted(result.alive), sorted(result.lost), sorted(result.revoked)


async def _run(ops: list[tuple[Any, ...]]) -> None:
    clock = FakeClock()
    memory = MemoryDriver(clock=clock)
    mongo = MongoDriver(mongomock_database(), create_indexes=True)
    await mongo.setup()
    lockstep = Lockstep(memory, mongo, clock)
    # every run starts with each task present, so most operations have something to act on
    for i, key in enumerate(KEYS):
        await lockstep.apply(("insert", key, i % len(OPTION_VARIANTS), False))
    for op in ops:
        await lockstep.apply(op)


@pytest.mark.timeout(400)  # only a failure takes long: Hypothesis shrinks it (up to 5 minutes)
@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(operation, min_size=10, max_size=40))
def test_memory_and_mongo_stores_stay_identical(ops: list[tuple[Any, ...]]) -> None:
    asyncio.run(_run(ops))


def test_a_known_busy_sequence_stays_identical() -> None:
    """A fixed sequence through every outcome, so the check runs even if Hypothesis is tuned down."""
    ops: list[tuple[Any, ...]] = [
        ("claim", "w0", 3, 1),
        ("claim", "w1", 2, 0),
        ("ping", "w0", 30),
        ("advance", 12),
        ("finish", "w0", 0, "failed", 5, False),
        ("finish", "w1", 0, "succeeded", None, False),
        ("option", "k2", 1),
        ("ping", "w0", 5),
        ("advance", 4),
        ("claim", "w2", 3, 1),
        ("finish", "w0", 1, "revoked", None, False),
        ("advance", 31),
        ("expire",),
        ("claim", "w1", 3, 1),
        ("finish", "w1", 1, "rejected", None, False),
        ("finish", "w1", 0, "released", 20, False),
        ("insert", "k1", 0, True),
        ("insert", "k3", 1, True),
        ("option", "k3", 4),
        ("claim", "w0", 3, 1),
        ("finish", "w0", 2, "succeeded", None, True),
        ("advance", 31),
        ("expire",),
    ]
    asyncio.run(_run(ops))
