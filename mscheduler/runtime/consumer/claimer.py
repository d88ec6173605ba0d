"""The claimer of the Consumer: it sleeps until a task may be claimable (the due-time heap that
``Discovery`` fills, or a flow limit's retry time), then claims up to the free slots in one
command and starts a handler task for each claimed attempt.

The batch doubles while claims come back full, but never asks for more than the heap says are
due while it knows them all: each slot asked for and not filled is a wasted command.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from mscheduler.domain.clock import ServerClock
from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.partitions import part_of, visit_order
from mscheduler.drivers.base import ClaimedTask, ClaimParams, Driver, ExpireParams
from mscheduler.observability.tracing import TaskTracer
from mscheduler.runtime.consumer.discovery import CLAIM, LEASE, Discovery
from mscheduler.runtime.consumer.handlers import Registered
from mscheduler.runtime.consumer.limiter import Limiter, attempt_tokens
from mscheduler.runtime.consumer.runner import Listener, RunningAttempt
from mscheduler.services.children import ChildSync
from mscheduler.services.events import EventKind, EventRecorder


class ConsumerClaimer:
    """The claimer side task of ``Consumer`` (a mixin: it uses the consumer's configuration,
    discovery, limiter and bookkeeping, and the runner's ``_execute``)."""

    driver: Driver
    clock: ServerClock
    rng: random.Random
    limiter: Limiter
    discovery: Discovery | None
    child_sync: ChildSync | None
    events: EventRecorder | None
    worker_id: str
    host: str
    pid: int
    groups: tuple[str, ...]
    concurrency: int
    poll_interval: float
    claim_lease: timedelta | None
    max_claim_batch: int
    max_attempt_entries: int
    stats: dict[str, int]
    _handlers: dict[str, Registered]
    _running: dict[str, RunningAttempt]
    _ran_fanout: OrderedDict[str, None]
    _handlers_active: int
    _slot_freed: asyncio.Event
    _ping_wake: asyncio.Event
    _claim_call: asyncio.Future[list[ClaimedTask]] | None
    _listeners: list[Listener]
    _tracer: TaskTracer | None

    if TYPE_CHECKING:

        async def _execute(self, running: RunningAttempt) -> None: ...

        def _emit(self, event: str, data: dict[str, Any]) -> None: ...

        def _record_event(
            self, running: RunningAttempt, kind: EventKind, detail: dict[str, Any] | None = None
        ) -> None: ...

        async def _storage_trouble(self, what: str, exc: StorageError, *, back_off: bool = True) -> None: ...

    def _excluded_from_claims(self, key: str) -> bool:
        """A key this consumer's claims leave out (``exclude_keys``): running here, or a fan-out
        task it already ran. Its wake-up would only start a claim that takes nothing."""
        return key in self._running or key in self._ran_fanout

    def _parts_to_visit(self, known: set[str] | None) -> list[int] | None:
        partitions = getattr(self.driver, "partitions", 1)
        if partitions == 1:
            return None
        with_work = {part_of(key, partitions) for key in known} if known else None
        return visit_order(partitions, with_work, self.rng)

    async def _run_claimer(self) -> None:
        assert self.discovery is not None
        queue = self.discovery.queue
        names = sorted(self._handlers)
        batch = 1
        more = True  # the last claim filled every slot asked for: there may be more now
        known: set[str] = set()  # keys the queue said are due that no claim has taken yet
        exact = True  # every claim since the store last ran dry took only tasks in ``known``
        while True:
            free = self.concurrency - self._handlers_active
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            now = self.clock.now()
            await self.limiter.maybe_refresh(names, self.clock.monotonic())
            if not (more or queue.due(now) or self.limiter.retry_due(now)):
                await self._wait_for_work(queue)
                continue
            due = queue.pop_due(now)
            rotation = self.discovery.rotation
            for lane in queue.due_lanes:  # a lane whose task fell due: visited again
                rotation.seen(lane)
            queue.due_lanes.clear()
            if exact:
                known |= due.get(CLAIM, set())
                if len(known) > queue.max_size:  # too many to follow: claim as if none were known
                    known.clear()
                    exact = False
            if LEASE in due:
                try:
                    expired = await self.driver.expire_leases(ExpireParams(now))
                except StorageError as exc:
                    await self._storage_trouble("expiring leases", exc)
                    expired = 0
                if expired:
                    self._emit("leases_expired", {"count": expired})
            # A doubling batch, but no more than the queue says are due while it knows them all:
            # asking for more would come back partly empty, each empty slot a wasted command.
            n = min(free, batch, len(known)) if exact and known else min(free, batch)
            exhausted: list[str | None] = []
            params = ClaimParams(
                worker_id=self.worker_id,
                names=names,
                now=now,
                attempts=attempt_tokens(n),
                max_lease=self.claim_lease,
                host=self.host,
                pid=self.pid,
                # an attempt whose outcome is still being written (or a stuck one) keeps its key;
                # untargeted fan-out tasks this worker already ran are excluded by key (filtered
                # on the claim index's keys, so the store does not fetch them to reject them)
                exclude_keys=[*self._running, *self._ran_fanout],
                max_entries=self.max_attempt_entries,
                groups=self.groups,
                # the partitions the queue says have work (all, when it does not know), from a
                # random one: a hot partition never makes the others wait
                parts=self._parts_to_visit(known if exact else None),
                # the lanes (fairness keys) in the rotation's order: the attempts are dealt over
                # them, so a key with a large backlog does not hold up the others
                lanes=rotation.turns(n),
                exhausted=exhausted,
            )
            # Shielded: a stop that cancels the claimer mid-claim must not orphan tasks the
            # store has already given us; stop() waits for the call and releases them.
            call = self.limiter.claim(params, self.driver.claim)
            if self._tracer is not None:
                call = self._tracer.claim(call, self.worker_id, n)
            self._claim_call = asyncio.ensure_future(call)
            try:
                claimed = await asyncio.shield(self._claim_call)
            except StorageError as exc:
                self._claim_call = None
                await self._storage_trouble("claim", exc)
                await self.clock.sleep(self.poll_interval)
                continue
            for task in claimed:
                self._start(task, now)
            self._claim_call = None
            rotation.claimed((task.lane, task.claim_priority) for task in claimed)
            rotation.exhausted(exhausted)
            if claimed:
                # Let the handlers just started take their first step: those that finish at once
                # free their slots now, so the next claim fills them in one round trip, not two.
                await asyncio.sleep(0)
            full = len(claimed) == n
            for task in claimed:  # a wake-up a poll queued again would count it a second time
                queue.discard(task.key, CLAIM)
            if not full:  # the store has nothing more for us now: start counting afresh
                known.clear()
                exact = True
            elif exact and all(task.key in known for task in claimed):
                known.difference_update(task.key for task in claimed)
            else:  # it had tasks the queue did not know of: the count says nothing
                known.clear()
                exact = False
            # Claim again at once while known tasks remain or there may be ones the queue does not
            # know of; else wait for the queue rather than send a claim that comes back empty.
            more = full and (not exact or bool(known) or queue.overflowed or self.discovery.page_full)
            batch = min(batch * 2, self.max_claim_batch) if full else 1
            if not more and queue.overflowed:
                self.discovery.request_poll()

    async def _wait_for_work(self, queue: Any) -> None:
        queue.changed.clear()
        when = queue.next_time()
        retry = self.limiter.next_retry()  # a limit that refused: ask again then
        if retry is not None and (when is None or retry < when):
            when = retry
        timeout = None if when is None else max((when - self.clock.now()).total_seconds(), 0.0)
        waiter = asyncio.ensure_future(queue.changed.wait())
        sleeper = asyncio.ensure_future(self.clock.sleep(timeout)) if timeout is not None else None
        try:
            await asyncio.wait(
                {t for t in (waiter, sleeper) if t is not None}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
            if sleeper is not None:
                sleeper.cancel()

    def _start(self, claimed: ClaimedTask, claim_time: datetime) -> None:
        running = RunningAttempt(claimed, claimed.option, claimed.ping_expire_time)
        running.slot = claimed.slot
        self._running[claimed.key] = running
        self._handlers_active += 1
        self.stats["claimed"] += 1
        attempt = self._execute(running)
        if self._tracer is not None:
            attempt = self._tracer.running(attempt, claimed, self.worker_id)
        running.task = asyncio.create_task(attempt, name=f"mscheduler:task:{claimed.key}")
        self._ping_wake.set()
        if claimed.parent is not None and self.child_sync is not None:
            self.child_sync.request_later([claimed.parent])
        running.started = self.clock.monotonic()
        if self._listeners:
            due = claimed.due_time
            wait = max(0.0, (claim_time - due).total_seconds()) if due is not None else None
            self._emit(
                "claimed",
                {
                    "key": claimed.key,
                    "attempt": claimed.attempt,
                    "worker_id": self.worker_id,
                    "name": claimed.name,
                    "queue_wait": wait,
                },
            )
        if self.events is not None:  # buffered: no write on the claim path
            self._record_event(running, EventKind.CLAIMED)
