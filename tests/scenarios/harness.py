"""Shared pieces of the fault scenarios: move fake time in steps, watch handlers, fake a store's clock.

Nothing here sleeps on the wall clock for a lease: tests move a ``FakeClock`` in small steps and let
the event loop run the consumers in between (``advance_until``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from mscheduler.domain.listing import ListParams
from mscheduler.drivers.base import (
    ChangeEvent,
    ClaimedTask,
    ClaimParams,
    Driver,
    ExpireParams,
    FinishParams,
    InsertParams,
    UpdateOptionParams,
    event_for,
)
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.clock import FakeClock

# With a real server (MSCHEDULER_TEST_MONGODB_URI) storage calls wait for the network: give them
# some wall-clock time per step too. (Untested here: no server on this machine.)
REAL_IO_PAUSE = 0.02 if os.environ.get("MSCHEDULER_TEST_MONGODB_URI") else 0.0


async def settle(rounds: int = 100) -> None:
    """Let every runnable coroutine run (memory and mongomock never really wait for I/O)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
    if REAL_IO_PAUSE:
        await asyncio.sleep(REAL_IO_PAUSE)
        for _ in range(rounds):
            await asyncio.sleep(0)


async def advance_until(
    clock: FakeClock,
    done: Callable[[], bool | Awaitable[bool]],
    *,
    step: float = 0.25,
    limit: float = 120.0,
    check: Callable[[], None] | None = None,
) -> float:
    """Advance ``clock`` by ``step`` until ``done()`` (sync or async); returns the fake seconds it took.

    ``check`` (an invariant) runs after every step. Fails after ``limit`` fake seconds.
    """
    elapsed = 0.0
    while True:
        await settle()
        if check is not None:
            check()
        finished = done()
        if inspect.isawaitable(finished):
            finished = await finished
        if finished:
            return elapsed
        if elapsed >= limit:
            raise AssertionError(f"not done after {limit} fake seconds")
        clock.advance(step)
        elapsed += step


async def advance(
    clock: FakeClock, seconds: float, *, step: float = 0.25, check: Callable[[], None] | None = None
) -> None:
    """Advance ``clock`` by ``seconds`` in steps, letting consumers run (and ``check``) after each."""
    elapsed = 0.0
    while elapsed < seconds:
        clock.advance(step)
        elapsed += step
        await settle()
        if check is not None:
            check()


class Overlap:
    """Counts handler runs per task key to catch two runs of one slot at the same time."""

    def __init__(self) -> None:
        self.active: Counter[str] = Counter()
        self.workers: dict[str, list[str]] = {}
        self.peak: Counter[str] = Counter()
        self.runs: Counter[str] = Counter()
        self.same_worker_twice: list[tuple[str, str]] = []

    def enter(self, key: str, worker_id: str) -> None:
        workers = self.workers.setdefault(key, [])
        if worker_id in workers:
            self.same_worker_twice.append((key, worker_id))
        workers.append(worker_id)
        self.active[key] += 1
        self.runs[key] += 1
        self.peak[key] = max(self.peak[key], self.active[key])

    def leave(self, key: str, worker_id: str) -> None:
        self.active[key] -= 1
        self.workers[key].remove(worker_id)


def is_mongomock(driver: Any) -> bool:
    inner = getattr(driver, "inner", driver)
    return isinstance(inner, MongoDriver) and any(
        "mongomock" in cls.__module__ for cls in type(inner.database).__mro__
    )


def running_entries(doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [e for e in (doc or {}).get("state", {}).get("worker_states", []) if e["status"] == "running"]


class Delegate:
    """A driver that passes every operation to ``inner``; subclasses override a few."""

    def __init__(self, inner: Driver) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class ServerTime(Delegate):
    """The store's clock as a real server's ``hello`` would report it (mongomock has no ``hello``).

    ``clock=None`` plays a server that cannot tell its time: consumers then trust their own clocks.
    """

    def __init__(self, inner: Driver, clock: FakeClock | None) -> None:
        super().__init__(inner)
        self.clock = clock

    async def server_time(self) -> datetime | None:
        return self.clock.now() if self.clock is not None else None


class StreamBus:
    """Change events for drivers that have no change stream (mongomock), shared by many consumers."""

    def __init__(self) -> None:
        self.subscribers: list[tuple[frozenset[str], asyncio.Queue[ChangeEvent]]] = []
        self.seq = 0

    def publish(self, doc: dict[str, Any]) -> None:
        self.seq += 1
        event = event_for(doc, token=self.seq)
        for names, queue in self.subscribers:
            if doc["name"] in names:
                queue.put_nowait(event)


class SimulatedStream(Delegate):
    """Announces every write on a ``StreamBus`` (read back after the write), and watches the bus.

    Like a real change stream it reports the document as it is some time after the change.
    ``end_every``: the stream ends by itself (as after an ``invalidate``) after that many events.
    """

    def __init__(self, inner: Driver, bus: StreamBus, *, end_every: int = 0) -> None:
        super().__init__(inner)
        self.bus = bus
        self.end_every = end_every
        self.opened = 0

    async def _announce(self, keys: Sequence[str]) -> None:
        for key in dict.fromkeys(keys):
            doc = await self.inner.get_task(key)
            if doc is not None:
                self.bus.publish(doc)

    async def insert_tasks(self, params: InsertParams) -> list[bool]:
        created = await self.inner.insert_tasks(params)
        await self._announce([t.key for t in params.tasks])
        return created

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        claimed = await self.inner.claim(params)
        await self._announce([c.key for c in claimed])
        return claimed

    async def finish(self, params: Sequence[FinishParams]) -> list[bool]:
        accepted = await self.inner.finish(params)
        await self._announce([p.key for p in params])
        return accepted

    async def expire_leases(self, params: ExpireParams) -> int:
        expired = await self.inner.expire_leases(params)
        if expired:
            for doc in await self.inner.list_tasks(ListParams(limit=100_000)):
                self.bus.publish(doc)
        return expired

    async def update_option(self, params: UpdateOptionParams) -> bool:
        changed = await self.inner.update_option(params)
        await self._announce([params.key])
        return changed

    async def watch(self, names: Sequence[str], resume_token: Any = None) -> AsyncIterator[ChangeEvent]:
        self.opened += 1
        queue: asyncio.Queue[ChangeEvent] = asyncio.Queue()
        subscriber = (frozenset(names), queue)
        self.bus.subscribers.append(subscriber)
        delivered = 0
        try:
            while True:
                yield await queue.get()
                delivered += 1
                if self.end_every and delivered >= self.end_every:
                    return
        finally:
            self.bus.subscribers.remove(subscriber)


class EndingStream(Delegate):
    """The inner driver's change stream, but each one ends by itself after ``end_every`` events
    (``0``: at once, before any event), as an ``invalidate`` ends a MongoDB change stream."""

    def __init__(self, inner: Driver, end_every: int) -> None:
        super().__init__(inner)
        self.end_every = end_every
        self.opened = 0

    async def watch(self, names: Sequence[str], resume_token: Any = None) -> AsyncIterator[ChangeEvent]:
        self.opened += 1
        if self.opened > 10_000:
            raise RuntimeError("the change stream was reopened 10,000 times: the watcher spins")
        if self.end_every == 0:
            return
        stream = self.inner.watch(names, resume_token)
        delivered = 0
        try:
            async for event in stream:
                yield event  # type: ignore[misc]  # (a stream of events: no positions here)
                delivered += 1
                if delivered >= self.end_every:
                    return
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()


def with_stream(driver: Driver, bus: StreamBus) -> Driver:
    """``driver`` itself where it has change streams; a ``SimulatedStream`` over it on mongomock."""
    return SimulatedStream(driver, bus) if is_mongomock(driver) else driver
