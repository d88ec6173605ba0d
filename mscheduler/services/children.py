"""Child tasks: a task made of named steps, each run by the handler of its name.

Layout (docs/design.md, "Child tasks: layout and the crash-safe follow-up"): every child is an
ordinary task document (key ``<parent key>/<child name>``, with ``parent`` and ``position``), so
its claim, lease, fencing, retries, pings and finish are the core's, unchanged. The parent is a
task document that is never claimed: its derived status follows from ``state.children``, a
summary ``[{name, key, status}]`` of its children (``mscheduler.domain.state.family_status``). In
sequential mode every child but the first is inserted ``blocked`` (pending, not claimable).

The follow-up of a child's change, in another document, is a *sync*: read the parent, then its
children, then unblock the next child (sequential mode) and write the parent's summary with a
compare-and-set on ``state.children_rev`` (``Driver.sync_parents``; ``plan_sync`` is its one
rule). A sync is idempotent and recomputed from the children's documents, so it may run any
number of times, anywhere: a consumer runs it right after a child's claim or finish is accepted
(``ChildSync.request``), and its reconciler pass (``ChildSync.run_once``) syncs every unfinished
parent every ``interval`` seconds, which repairs what a crash between a finish and its sync
left, and what changes children without a consumer's finish (lost leases, deadlines).

Workflows (``children_mode="graph"``) ride the same sync: a blocked step is unblocked once the
steps it needs have succeeded, and a map step is fanned out into its items then
(``mscheduler.publishing.sync_families``); a fanned-out map step is a parent of its items.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime

from mscheduler.domain.clock import Clock, SystemClock, sleep_unless
from mscheduler.domain.exceptions import InvalidInput, MSchedulerError, StorageError
from mscheduler.drivers.base import Driver, OpenParentsParams
from mscheduler.publishing import sync_families

log = logging.getLogger("mscheduler.children")

DEFAULT_INTERVAL = 10.0  # seconds between reconciler passes
DEFAULT_BATCH = 500  # parents per sync command
ERROR_PAUSE = 1.0  # seconds a sync waits after a storage error before it tries again
# a child's claim is followed by its parent's sync this much later (its finish, if sooner, syncs
# it anyway): a short step costs one sync, not two; a long one shows its parent running by then
CLAIM_SYNC_DELAY = 1.0


class ChildSync:
    """Keeps parents in step with their children: ``request`` syncs soon (a consumer calls it
    after a child's claim or finish), ``run_once`` is the reconciler pass over every unfinished
    parent. Any number may run at once (syncs are idempotent compare-and-sets).

    :param driver: the storage.
    :param clock: time source (a consumer passes its server-corrected clock).
    :param interval: seconds between reconciler passes of ``run``.
    :param batch: parents per sync command.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        clock: Clock | None = None,
        interval: float = DEFAULT_INTERVAL,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        if not 0 < interval <= 3600:
            raise InvalidInput("interval: must be more than 0 and at most 3600 seconds")
        if not isinstance(batch, int) or not 1 <= batch <= 10_000:
            raise InvalidInput("batch: must be an integer from 1 to 10,000")
        self.driver = driver
        self.clock: Clock = clock or SystemClock()
        self.interval = interval
        self.batch = batch
        self.passes = 0  # reconciler passes done
        self.repaired = 0  # parents a reconciler pass found behind their children
        self._requested: set[str] = set()
        self._later: dict[str, float] = {}  # parent key -> when to sync it (the clock's monotonic)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()

    @property
    def requested(self) -> int:
        """Parents waiting for their requested sync (cleared by each ``flush``)."""
        return len(self._requested)

    def request(self, keys: Iterable[str]) -> None:
        """Sync these parents soon (``run`` does it at once)."""
        new = set(keys) - self._requested
        if new:
            self._requested |= new
            for key in new:
                self._later.pop(key, None)
            self._wake.set()

    def request_later(self, keys: Iterable[str], after: float = CLAIM_SYNC_DELAY) -> None:
        """Sync these parents in ``after`` seconds, unless ``request`` asks for it sooner (a
        child's claim: the finish of a short step syncs its parent anyway)."""
        due = self.clock.monotonic() + after
        for key in keys:
            if key not in self._requested and key not in self._later:
                self._later[key] = due
                self._wake.set()

    def _due_later(self) -> float | None:
        """Move the deferred requests that are due to ``request``; when the next one is due."""
        if not self._later:
            return None
        now = self.clock.monotonic()
        due = [key for key, at in self._later.items() if at <= now]
        if due:
            self.request(due)
        return min(self._later.values(), default=None)

    async def sync(self, keys: Sequence[str], now: datetime | None = None) -> int:
        """Sync these parents now, ``batch`` at a time; returns how many changed."""
        changed = 0
        now = now if now is not None else self.clock.now()
        for start in range(0, len(keys), self.batch):
            if start:
                await asyncio.sleep(0)  # a long list: hand the loop back between batches
            changed += await sync_families(self.driver, keys[start : start + self.batch], now)
        return changed

    async def flush(self) -> None:
        """Sync what was requested (a stopping consumer's last step: the deferred ones too)."""
        if self._stopping.is_set() and self._later:
            self.request(list(self._later))
        keys, self._requested = sorted(self._requested), set()
        if keys:
            try:
                await self.sync(keys)
            except BaseException:
                self._requested.update(keys)
                raise

    async def run_once(self, now: datetime | None = None) -> int:
        """One reconciler pass: sync every unfinished parent, a page at a time; returns how many
        were behind their children (and are not any more)."""
        repaired = 0
        after: str | None = None
        while True:
            keys = await self.driver.find_open_parents(OpenParentsParams(after, self.batch))
            if not keys:
                break
            repaired += await self.sync(keys, now)
            if len(keys) < self.batch:
                break
            after = keys[-1]
            await asyncio.sleep(0)  # a page at a time: the in-memory store answers without awaiting
        self.passes += 1
        self.repaired += repaired
        if repaired:
            log.info("child tasks: %d parents were behind their children, synced", repaired)
        return repaired

    async def run(self) -> None:
        """Sync requests as they come and a reconciler pass every ``interval`` seconds, until
        ``stop``. Storage errors are logged and retried (configuration errors are raised)."""
        next_pass = self.clock.monotonic()
        while not self._stopping.is_set():
            self._wake.clear()
            next_later = self._due_later()
            try:
                await self.flush()
                if self.clock.monotonic() >= next_pass:
                    next_pass = self.clock.monotonic() + self.interval
                    await self.run_once()
            except StorageError as exc:
                if exc.config:
                    raise
                log.warning("child task sync failed (%s); trying again", exc)
                await self._sleep(ERROR_PAUSE)
                continue
            except MSchedulerError as exc:
                log.error("child task sync failed (%s); trying again", exc)
                await self._sleep(ERROR_PAUSE)
                continue
            if not self._requested:
                wake_at = next_pass if next_later is None else min(next_pass, next_later)
                await self._sleep(max(wake_at - self.clock.monotonic(), 0.0))

    async def _sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or until a request or ``stop``."""
        await sleep_unless(self.clock, seconds, self._wake, self._stopping)

    def stop(self) -> None:
        """Ask ``run`` to return (idempotent)."""
        self._stopping.set()
