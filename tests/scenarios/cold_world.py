"""A store set up by its administrator, and drivers over it that nobody prepared (the matrix of
``test_cold_drivers.py``).

``World`` is one store — the memory driver, or ``MongoDriver`` on mongomock — with P = 1 or 4
partitions, set up the administrator's way (``setup()``: the layout recorded) through its own
driver, ``admin``. The entry point under test gets ``cold()``: a driver built the way its surface
builds one and never prepared (the CLI's ``Operations(MongoDriver(db))``; on the memory driver,
the store itself, whose ``prepare`` has nothing to read). The seeding helpers write through
``admin`` only, eight tasks at a time whose keys fall in every partition; ``placed()`` says
whether every stored task sits in its own partition.

Times: the fake clock starts two hours before the real time, so that the CLI (on the system
clock) sees the seeded leases run out, deadlines passed and plans due, as the fake clock does
after ``clock.advance``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from mscheduler import (
    CatchUp,
    EverySchedule,
    FakeClock,
    MemoryDriver,
    MongoDriver,
    Operations,
    Plan,
    PlanTiming,
    Publisher,
    Task,
    TaskOption,
)
from mscheduler.domain.listing import ListParams
from mscheduler.domain.partitions import part_of
from mscheduler.drivers.base import ClaimParams, Driver, FinishParams, WorkerInfo
from mscheduler.testing.mongomock import mongomock_database

KEYS = [f"t-{i}" for i in range(8)]  # partitions 3, 2, 1, 0, 3, 3, 1, 3 of 4: every one
LAYOUTS = [("memory", 1), ("memory", 4), ("mongomock", 1), ("mongomock", 4)]
LAYOUT_IDS = [f"{kind}-p{p}" for kind, p in LAYOUTS]
NAME = "job"
STEPS = ["step.one", "step.two"]  # a family's steps (each a handler name)
LEASE = timedelta(seconds=30)
ERROR = {"type": "RuntimeError", "message": "boom", "traceback": None}


def keys(prefix: str, n: int = 8) -> list[str]:
    """The first ``n`` of eight keys in every partition of 4 (four: one in each), under a prefix
    (``prefix`` replaces ``t``)."""
    return [prefix + k[1:] for k in KEYS[:n]]


@dataclass
class World:
    kind: str
    partitions: int
    clock: FakeClock
    admin: Driver
    database: Any = None
    _tokens: Any = field(default_factory=itertools.count)

    def cold(self, **options: Any) -> Driver:
        """A driver over this store that nothing has prepared (``options``: ``MongoDriver``'s)."""
        if self.database is None:
            return self.admin
        return MongoDriver(self.database, **options)

    def ops(self, driver: Driver | None = None) -> Operations:
        return Operations(driver or self.cold(), clock=self.clock)

    @property
    def now(self) -> datetime:
        return self.clock.now()

    # -- seeding, through the administrator's driver ----------------------------------------------

    async def send(self, keys: Sequence[str], **option: Any) -> None:
        tasks = [Task(k, NAME, {"k": k}, option=TaskOption(**option)) for k in keys]
        assert all(await Publisher(self.admin, clock=self.clock).send_many(tasks))

    async def claim(self, keys: Sequence[str], name: str = NAME, worker: str = "w-old") -> dict[str, str]:
        """Claim exactly ``keys`` (each, when claimed, the only claimable task of ``name``)."""
        attempts: dict[str, str] = {}
        for key in keys:
            token = f"a{next(self._tokens)}"
            params = ClaimParams(worker, [name], self.now, [token], max_lease=LEASE)
            claimed = await self.admin.claim(params)
            assert [c.key for c in claimed] == [key], (key, [c.key for c in claimed])
            attempts[key] = token
        return attempts

    async def pending(self, prefix: str = "t", n: int = 8, **option: Any) -> list[str]:
        chosen = keys(prefix, n)
        await self.send(chosen, **option)
        return chosen

    async def running(self, prefix: str = "r") -> dict[str, str]:
        """Eight running tasks, each claimed alone (so each claim takes the one sent last)."""
        attempts: dict[str, str] = {}
        for key in keys(prefix):
            await self.send([key], max_unexpected_retries=3, retry_delay=timedelta(0))
            attempts |= await self.claim([key])
        return attempts

    async def failed(self, prefix: str = "f", n: int = 8) -> list[str]:
        attempts: dict[str, str] = {}
        for key in keys(prefix, n):
            await self.send([key], max_unexpected_retries=0)
            attempts |= await self.claim([key])
        items = [
            FinishParams(k, "w-old", a, self.now, "failed", None, ERROR, None, True)
            for k, a in attempts.items()
        ]
        assert all(await self.admin.finish(items))
        return list(attempts)

    async def succeeded(self, prefix: str = "s") -> list[str]:
        attempts: dict[str, str] = {}
        for key in keys(prefix):
            await self.send([key])
            attempts |= await self.claim([key])
        items = [FinishParams(k, "w-old", a, self.now, "succeeded", {"ok": 1}) for k, a in attempts.items()]
        assert all(await self.admin.finish(items))
        return list(attempts)

    async def family(self, prefix: str = "fam") -> list[str]:
        """Eight parents of two children each (``<parent>/one``, ``<parent>/two``)."""
        parents = keys(prefix)
        tasks = [Task(k, NAME, {}, children=STEPS) for k in parents]
        assert all(await Publisher(self.admin, clock=self.clock).send_many(tasks))
        return parents

    async def finished_steps(self, prefix: str = "wf", n: int = 8) -> list[str]:
        """``n`` workflows of two parallel steps, each step succeeded (a finished step may be
        restarted); returns the workflows' keys."""
        parents = keys(prefix, n)
        tasks = [Task(k, NAME, {}, children=STEPS, children_mode="parallel") for k in parents]
        assert all(await Publisher(self.admin, clock=self.clock).send_many(tasks))
        for step in STEPS:
            tokens = [f"a{next(self._tokens)}" for _ in parents]
            claimed = await self.admin.claim(ClaimParams("w-old", [step], self.now, tokens, max_lease=LEASE))
            assert len(claimed) == n, claimed
            done = [
                FinishParams(c.key, "w-old", c.attempt, self.now, "succeeded", {"ok": 1}) for c in claimed
            ]
            assert all(await self.admin.finish(done))
        return parents

    async def plans(self, n: int = 8) -> list[str]:
        ops = Operations(self.admin, clock=self.clock)
        ids = [f"plan-{i}" for i in range(n)]
        for plan_id in ids:
            # late occurrences run once: the CLI, on the real clock, comes to them a little late
            schedule = EverySchedule(interval=timedelta(hours=1), start=self.now)
            timing = PlanTiming(schedule=schedule, catch_up=CatchUp.RUN_ONCE)
            await ops.add_plan(Plan(plan_id=plan_id, name=NAME, timing=timing))
        return ids

    async def worker(self, worker_id: str = "w-live") -> None:
        await self.admin.register_worker(WorkerInfo(worker_id, "host", 1, (NAME,), 4, self.now))

    # -- reading back --------------------------------------------------------------------------------

    async def docs(self) -> dict[str, dict[str, Any]]:
        found = await self.admin.list_tasks(ListParams(limit=10_000))
        return {doc["key"]: doc for doc in found}

    async def statuses(self, keys: Sequence[str]) -> dict[str, str | None]:
        docs = await self.docs()
        return {k: (docs[k]["state"]["status"] if k in docs else None) for k in keys}

    async def misplaced(self) -> list[str]:
        """Stored tasks not in their own partition (a write through a driver that took the store
        for another layout)."""
        if self.database is None:
            docs = list((await self.docs()).values())
        else:
            docs = [doc async for doc in self.database["mscheduler_tasks"].find({}, {"key": 1, "part": 1})]
        return sorted(d["key"] for d in docs if d.get("part") != part_of(d["key"], self.partitions))


async def make_world(kind: str, partitions: int) -> World:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    clock = FakeClock(start)
    if kind == "memory":
        memory = MemoryDriver(clock=clock, partitions=partitions, events=True)
        await _a_live_worker(memory)
        return World(kind, partitions, clock, memory)
    database = mongomock_database(f"cold_{next(_worlds)}")
    admin = MongoDriver(database, partitions=partitions, events=True)
    await admin.setup()  # the administrator's step: the layout recorded, the indexes built
    await _a_live_worker(admin)
    return World(kind, partitions, clock, admin, database)


async def _a_live_worker(driver: Driver) -> None:
    """A consumer handling the world's names, seen now (the wall clock: the CLI's processes read
    it), so that sends through the door are taken."""
    names = [NAME, *STEPS]
    await driver.register_worker(WorkerInfo("w-handler", "h", 1, names, 1, datetime.now(UTC)))


def world_now(kind: str, partitions: int) -> World:
    """``make_world`` outside any event loop (the CLI's tests run one per command)."""
    return asyncio.run(make_world(kind, partitions))


_worlds = itertools.count()
