"""Remote executors: workers that do not speak MongoDB lease tasks, ping them and
report their outcomes through a service (the REST API's ``/api/v1/executors`` routes call it).

The rules are the Python consumer's, not copies of them: a lease is the same atomic claim
(``ClaimParams``: names, worker id, targeting, priority, the retry budget), a ping the same fenced
lease renewal with checkpoints and progress riding it, a report the same fenced finish built by
the shared outcome rules (``mscheduler.domain.outcomes``: retry policy, ``Retry`` / ``Fail`` /
``Snooze``, result caps, "failed for good"). A report or ping of an attempt whose lease moved on
changes nothing and says so (``LeaseLost``; the API answers 409).

An executor is registered as a worker at its first lease and heartbeats with its later ones (it
shows in ``workers ls``; a remote stop reaches it as ``stop_requested`` in the lease answer).

A lease may wait (long poll) up to ``max_wait`` seconds when nothing is due: the wait wakes on
the store's change stream where there is one (one watch per set of names, shared by every
waiting lease), at the next known claim or lease-expiry time, and otherwise polls with a short
backoff; it is bounded by the wait asked for. Outcomes of concurrent reports are written in
batches (one ``finish`` command for whatever piled up while the last one was in flight).

Flow limits (``Operations.set_limit``) hold for executors as for consumers, by the consumer's own
``Limiter`` (``mscheduler.runtime.consumer.limiter``; one per service, shared by its executors): a lease
of limited names acquires slots for the executor's attempts (stamped with its worker id) and
claims with the grants, the same ``now`` and a first lease capped at the slot's expiry; a limit
that refused waits a backoff (a rate: until its window frees a start) while the lease's other
names are still claimed, and a waiting lease re-checks then, or at once when a report through
this service frees a slot of it. A ping extends the attempts' slots before their leases (an
attempt whose slot is gone is ``lost``); a report releases the slot alongside the next finish
batch; an attempt never reported keeps its slot until the slot's expiry (its lease's end).

Several API servers may serve one executor (a ping or report may reach another server than its
lease): which limit holds an attempt's slot is remembered from the lease, else read from the store
(``held_slots``: the slot records its attempt token and worker id), never guessed from the
current name -> limit mapping, which may have changed since the lease.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mscheduler.domain.clock import Clock, ServerClock, sleep_unless
from mscheduler.domain.exceptions import (
    InvalidInput,
    LeaseLost,
    MSchedulerError,
    StorageError,
)
from mscheduler.domain.fairness import Fairness, FairRotation
from mscheduler.domain.limits import DEFAULT_SLOT_LEASE
from mscheduler.domain.model import (
    GROUP_PREFIX,
    AttemptStatus,
    validate_group,
    validate_key,
    validate_name,
)
from mscheduler.domain.outcomes import (
    DEFAULT_MAX_RESULT_BYTES,
    Outcome,
    error_dict,
    fail_for_good,
    failed,
    fails_for_good,
    retry_after,
    snoozed,
    succeeded,
)
from mscheduler.domain.state import claimer_tokens, laneless, token_lane
from mscheduler.drivers.base import (
    FAILURE_STATUSES,
    AttemptReport,
    ChangeEvent,
    ChangeStreamUnsupported,
    ClaimedTask,
    ClaimParams,
    Driver,
    ExpireParams,
    FinishParams,
    LaneParams,
    PingParams,
    ResumeTokenLost,
    WakeupParams,
    WorkerInfo,
    cancelled_error,
    paused_error,
)
from mscheduler.runtime.consumer.limiter import Limiter
from mscheduler.runtime.consumer.reports import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
    checked_checkpoint,
    checked_progress,
)
from mscheduler.services.events import EventKind, EventRecorder, outcome_detail, outcome_kind

log = logging.getLogger("mscheduler.remote")

MAX_TASKS_PER_LEASE = 100
MAX_GROUPS = 100  # groups one executor may belong to
MAX_PINGS = 1000  # attempts in one ping
DEFAULT_MAX_WAIT = 30.0  # seconds a lease may wait for work at most
WORKER_ID_MAX = 200
HOST_MAX = 200
OPTIONS_KEPT = 100_000  # (key, attempt) -> option and slot of leased attempts, to renew without a read
WORKERS_KEPT = 10_000  # executors whose registration this service remembers
REPORT_OUTCOMES = ("succeeded", "failed", "snoozed", "released")
WAKEUPS_READ = 16  # wake-ups a waiting lease reads (those already due say nothing new)
ROTATIONS_KEPT = 1000  # name sets whose fairness rotation this service remembers
_POLL_FIRST = 0.05  # the first pause of a polling wait; it doubles up to poll_interval
# ping answers whose attempts the service settles at once (the executor stops, reports nothing)
_SETTLED_AT_THE_ANSWER: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "cancelled": (AttemptStatus.CANCELLED.value, cancelled_error),
    "paused": (AttemptStatus.RELEASED.value, paused_error),
    "revoked": (AttemptStatus.REVOKED.value, lambda: error_dict("Cancelled", "attempt revoked")),
}


def check_worker_id(worker_id: object) -> str:
    """An executor's worker id: the consumer's rule (1 to 200 characters, not starting with '$'
    nor with ``g:``, a group's token: such an id would claim the tasks aimed at that group) and
    no spaces or control characters (it travels in logs and JSON)."""
    if (
        not isinstance(worker_id, str)
        or not 1 <= len(worker_id) <= WORKER_ID_MAX
        or worker_id.startswith(("$", GROUP_PREFIX))
        or any(c.isspace() or not c.isprintable() for c in worker_id)
    ):
        raise InvalidInput(
            f"worker_id: 1 to {WORKER_ID_MAX} printable characters without spaces, not starting "
            f"with '$' or '{GROUP_PREFIX}'"
        )
    return worker_id


@dataclass(slots=True, frozen=True)
class Lease:
    """A lease's answer: the claimed attempts (maybe none), and whether an operator asked this
    executor to stop (then nothing was claimed)."""

    tasks: list[ClaimedTask]
    stop_requested: bool = False
    claimed_at: datetime | None = None  # the claim's ``now`` (the start of the first leases)

    def first_lease(self, task: ClaimedTask) -> float:
        """Seconds of the lease this answer grants: the task's ``worker_timeout``, or less when a
        flow-limit slot capped it."""
        full = float(task.option["worker_timeout_ms"]) / 1000
        if self.claimed_at is None:
            return full
        return min(full, max((task.ping_expire_time - self.claimed_at).total_seconds(), 0.0))

    def ping_interval(self, task: ClaimedTask) -> float:
        """How soon to ping: the task's ``ping_interval``, or a third of a capped first lease
        (the consumer's rule for ``claim_lease``), so that the first ping comes in time."""
        interval: float = task.option["ping_interval_ms"] / 1000
        if self.first_lease(task) < task.option["worker_timeout_ms"] / 1000:
            interval = min(interval, self.first_lease(task) / 3)
        return interval


@dataclass(slots=True, frozen=True)
class AttemptPing:
    """One running attempt to keep alive, with what to record on its task (like a handler's
    ``ctx.checkpoint`` / ``ctx.progress``): ``save_checkpoint`` with ``checkpoint`` (None is a
    checkpoint too) and / or ``progress`` ``{"fraction", "message"}``."""

    key: str
    attempt: str
    save_checkpoint: bool = False
    checkpoint: Any = None
    progress: Mapping[str, Any] | None = None


@dataclass(slots=True, frozen=True)
class PingAnswer:
    """``state``: ``alive`` (renewed until ``lease_expires``; ping again within
    ``ping_interval`` seconds), or ``lost`` / ``revoked`` / ``cancelled`` / ``paused``: stop
    working, report nothing (the service settled a revoked, cancelled or paused attempt with
    this answer: ``revoked``, ``cancelled``, ``released``). ``recorded``: its checkpoint /
    progress was stored."""

    key: str
    attempt: str
    state: str
    lease_expires: datetime | None = None
    ping_interval: float | None = None
    recorded: bool = False


@dataclass(slots=True, frozen=True)
class AttemptResult:
    """What an executor reports about an attempt (the HTTP body's domain form).

    ``succeeded`` with ``result``; ``failed`` with ``error`` {type, message, traceback}, retried
    by the task's retry policy, or after ``retry_after`` seconds (Python's ``Retry``), or never
    (``final``: Python's ``Fail``); ``snoozed`` for ``retry_after`` seconds (``Snooze``, not a
    failure); ``released`` (given back unrun, e.g. the executor is stopping: not a failure)."""

    outcome: str
    result: Any = None
    error_type: str | None = None
    message: str = ""
    traceback: str | None = None
    retry_after: float | None = None
    final: bool = False


@dataclass(slots=True, frozen=True)
class Reported:
    """A report the store took: what was written (``duplicate``: the same outcome had been
    recorded already by this attempt, e.g. a report sent again after a lost reply)."""

    key: str
    attempt: str
    outcome: Outcome
    duplicate: bool = False


@dataclass(slots=True)
class _Waiter:
    worker_id: str
    tokens: frozenset[str]  # its claimer tokens without a lane (``laneless``)
    rotation: FairRotation  # the lanes its next claim visits: an event's lane joins them
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    next_at: datetime | None = None  # the earliest future time the stream told of
    limits: frozenset[str] = frozenset()  # the flow limits covering its names
    # claim now: an event told of a task claimable now, or a slot of one of its limits was
    # released through this service (a later time the stream told of does not hide either)
    ready: bool = False


class _Doorbell:
    """One change-stream watch over a set of names, shared by the leases waiting on it; closed
    when the last one leaves. Events are hints: a waiter wakes and claims (or re-arms its timer
    to a claim time the event announces)."""

    def __init__(self, driver: Driver, clock: Clock, names: frozenset[str]) -> None:
        self.driver = driver
        self.clock = clock
        self.names = names
        self.waiters: list[_Waiter] = []
        self.streaming = False  # the stream delivered an event: it is open and healthy
        self.task: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()

    def add(self, waiter: _Waiter) -> None:
        self.waiters.append(waiter)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._watch())

    def remove(self, waiter: _Waiter) -> None:
        self.waiters.remove(waiter)
        if not self.waiters and self.task is not None:
            self.task.cancel()
            self.task = None
            self.streaming = False

    async def _watch(self) -> None:
        try:
            async for event in self.driver.watch(sorted(self.names)):
                self.streaming = True
                if isinstance(event, ChangeEvent):
                    self._ring(event)
        except (ChangeStreamUnsupported, ResumeTokenLost, StorageError) as exc:
            log.debug("executors' change stream on %s unavailable: %s", sorted(self.names), exc)
        self.streaming = False  # ended: the waiters poll

    def _ring(self, event: ChangeEvent) -> None:
        now = self.clock.now()
        for waiter in self.waiters:
            when: datetime | None = None
            if event.claimers is not None:
                mine = waiter.tokens.intersection(laneless(t) for t in event.claimers)
                if mine or not event.claimers_complete:
                    when = event.claim_at or now
                    if event.claimers:
                        waiter.rotation.seen(token_lane(event.claimers[0]), event.priority)
            elif not event.specific_worker_ids or waiter.worker_id in event.specific_worker_ids:
                when = event.claim_at
            if event.lease_expiry is not None and (when is None or event.lease_expiry < when):
                when = event.lease_expiry
            if when is None:
                continue
            if when > now:
                waiter.next_at = when if waiter.next_at is None else min(waiter.next_at, when)
            else:
                waiter.ready = True
            waiter.wake.set()


@dataclass(slots=True)
class _PendingFinish:
    params: FinishParams
    future: asyncio.Future[bool]
    slot: str | None = None  # the flow limit whose slot to release once the outcome is written


class _Finisher:
    """Writes the outcomes of concurrent reports in batches: one ``finish`` command for what
    piled up while the last was in flight. Flow-limit slots of the attempts whose
    outcome was written (or refused) are released alongside the next batch (the consumer's
    finisher does the same), or on their own once no report is waiting."""

    def __init__(self, driver: Driver, limiter: Limiter, clock: Clock) -> None:
        self.driver = driver
        self.limiter = limiter
        self.clock = clock
        self.loop = asyncio.get_running_loop()
        self.pending: list[_PendingFinish] = []
        self.task: asyncio.Task[None] | None = None
        self.added = asyncio.Event()  # a report came (or idle() wants the held releases out)
        self.draining = False

    async def submit(self, params: FinishParams, slot: str | None) -> bool:
        pending = _PendingFinish(params, self.loop.create_future(), slot)
        self.pending.append(pending)
        self.added.set()
        self.kick()
        return await asyncio.shield(pending.future)

    def kick(self) -> None:
        """Make sure the loop runs (outcomes or slot releases are waiting)."""
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    async def idle(self) -> None:
        """Wait until nothing is waiting to be written (tests, and ``RemoteExecutors.aclose``):
        releases held for the next acquire go now."""
        self.draining = True
        self.added.set()
        try:
            while self.task is not None and not self.task.done():
                await asyncio.shield(self.task)
        finally:
            self.draining = False

    async def _run(self) -> None:
        while self.pending or self.limiter.releases:
            batch, self.pending = self.pending, []
            if not batch:  # releases only: one try; those refused run out at their expiry
                self.added.clear()
                wait = None if self.draining else self.limiter.release_due_in(self.clock.now())
                if wait:  # held for the next acquire of their limit: until due, or a report
                    await sleep_unless(self.clock, wait, self.added)
                    continue
                if not await self.limiter.flush(self.clock.now(), everything=self.draining):
                    return
                continue
            release = (
                asyncio.ensure_future(self.limiter.flush(self.clock.now())) if self.limiter.releases else None
            )
            try:
                accepted = await self.driver.finish([p.params for p in batch])
            except BaseException as exc:  # each caller gets the error (the API maps it)
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                        p.future.exception()  # retrieved: a caller that went away stays quiet
                if release is not None:
                    await asyncio.gather(release, return_exceptions=True)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            if release is not None:
                await release
            for p, ok in zip(batch, accepted, strict=True):
                if p.slot is not None:  # written, or refused (the lease had gone): the slot is free
                    self.limiter.release(p.slot, p.params.worker_id, p.params.attempt)
                if not p.future.done():
                    p.future.set_result(ok)


@dataclass(slots=True, frozen=True)
class _Held:
    """What this service remembers of a leased attempt: its task's option (the lease length) and
    the flow limit whose slot it holds (None: none)."""

    option: dict[str, Any]
    slot: str | None


class RemoteExecutors:
    """Lease, ping and report for executors that reach the store through this service.

    :param driver: the store.
    :param clock: the time source; by default the system clock corrected to the server's (as a
        consumer's). Waits run on it too (tests move a ``FakeClock``).
    :param max_wait: the longest a lease waits for work; a longer wait asked for is cut to it.
    :param poll_interval: the longest pause between two claims of a waiting lease where no change
        stream is open (it starts at 0.05 s and doubles).
    :param stream_poll_interval: the same while a change stream is open (the floor under hints).
    :param heartbeat_interval: an executor's registry entry is refreshed by a lease at most this
        often.
    :param max_result_bytes: the largest result a report may carry (the consumer's rule: a
        larger one fails the task at once, without retries).
    :param max_checkpoint_bytes: the largest checkpoint a ping may carry (a larger one: 422).
    :param maintenance_interval: leases also mark expired leases lost and expire tasks past
        their deadline, at most this often (what a consumer's poller does), so that a fleet of
        executors alone recovers the tasks of a dead one.
    :param limits_interval: seconds a name's flow limit (or its having none) is remembered before
        a lease reads it again (``Consumer(limits_interval=...)``'s role).
    :param limit_backoff: after a limit refused a slot, about this many seconds (jittered) before
        this service asks it again for any executor (``Consumer(limit_backoff=...)``).
    :param slot_lease: a flow-limit slot's first lease, and so the cap of a limited task's first
        lease (``Consumer(claim_lease=...)``'s role for limits; default 30 s); pings extend both.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        clock: Clock | None = None,
        max_wait: float = DEFAULT_MAX_WAIT,
        poll_interval: float = 1.0,
        stream_poll_interval: float = 5.0,
        heartbeat_interval: float = 5.0,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        maintenance_interval: float = 1.0,
        limits_interval: float = 2.0,
        limit_backoff: float = 0.2,
        slot_lease: float | None = None,
        fairness: Fairness | None = None,
    ) -> None:
        if not 0 <= max_wait <= 300:
            raise InvalidInput("max_wait must be from 0 to 300 seconds")
        for label, value in (
            ("poll_interval", poll_interval),
            ("stream_poll_interval", stream_poll_interval),
            ("heartbeat_interval", heartbeat_interval),
            ("maintenance_interval", maintenance_interval),
            ("limits_interval", limits_interval),
            ("limit_backoff", limit_backoff),
            ("slot_lease", DEFAULT_SLOT_LEASE.total_seconds() if slot_lease is None else slot_lease),
        ):
            if not 0 < value <= 3600:
                raise InvalidInput(f"{label} must be more than 0 and at most 3600 seconds")
        if not 1 <= max_result_bytes <= 15 * 1024 * 1024 or not 1 <= max_checkpoint_bytes <= 15 * 1024 * 1024:
            raise InvalidInput("max_result_bytes and max_checkpoint_bytes: 1 byte to 15 MiB")
        self.driver = driver
        self.clock = clock if isinstance(clock, ServerClock) else ServerClock(clock)
        self.max_wait = max_wait
        self.poll_interval = poll_interval
        self.stream_poll_interval = stream_poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.max_result_bytes = max_result_bytes
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.maintenance_interval = maintenance_interval
        self.limits_interval = limits_interval
        self.rng = random.Random()  # retry jitter; tests may seed it
        # flow limits: the consumer's limiter, its slots stamped with each executor's id
        self.limiter = Limiter(
            driver,
            refresh=limits_interval,
            backoff=limit_backoff,
            slot_lease=timedelta(seconds=slot_lease) if slot_lease is not None else None,
            rng=self.rng,
            on_free=self._slot_freed,
        )
        self._synced = False
        self._maintained_at: float | None = None
        self._workers: OrderedDict[str, float] = OrderedDict()  # worker id -> last heartbeat (mono)
        # worker id -> the groups of its last lease (a ping that names none renews with them)
        self._groups: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._held: OrderedDict[tuple[str, str], _Held] = OrderedDict()
        self._bells: dict[frozenset[str], _Doorbell] = {}
        # per set of names leased: the lanes (fairness keys) its claims rotate over, as a
        # consumer's (mscheduler.domain.fairness), refreshed before each wait
        self.fairness = fairness or Fairness()
        self._rotations: OrderedDict[frozenset[str], FairRotation] = OrderedDict()
        self._finisher: _Finisher | None = None
        # report numbers of checkpoints / progress (read back to tell whether one landed)
        self._seq = time.time_ns() // 1000
        self.events: EventRecorder | None = (
            EventRecorder(driver, self.clock) if getattr(driver, "record_events", False) else None
        )
        self.stats = {"leases": 0, "claimed": 0, "pings": 0, "reports": 0, "refused": 0, "slot_lost": 0}

    async def _now(self) -> datetime:
        if not self._synced:
            await self.clock.sync(self.driver.server_time)
            self._synced = True
        return self.clock.now()

    # -- lease ------------------------------------------------------------------------------------

    async def lease(
        self,
        worker_id: str,
        names: Sequence[str],
        *,
        max_tasks: int = 1,
        wait: float = 0.0,
        host: str | None = None,
        pid: int = 0,
        running: int = 0,
        groups: Sequence[str] = (),
    ) -> Lease:
        """Claim up to ``max_tasks`` due tasks named ``names`` for ``worker_id`` (the consumer's
        claim); when none is due, wait up to ``wait`` seconds (at most ``max_wait``) for one.
        ``running``: how many attempts the executor holds now (shown in the worker registry).
        ``groups``: the groups it belongs to (``Consumer(groups=...)``): it also takes tasks whose
        ``specific_groups`` name one of them.
        Names under a flow limit are claimed with the limit's slots (as a consumer's)."""
        worker_id = check_worker_id(worker_id)
        names = _checked_names(names)
        member_of = checked_groups(groups)
        if not isinstance(max_tasks, int) or not 1 <= max_tasks <= MAX_TASKS_PER_LEASE:
            raise InvalidInput(f"max_tasks must be from 1 to {MAX_TASKS_PER_LEASE}")
        if not isinstance(wait, (int, float)) or not math.isfinite(wait) or wait < 0:
            raise InvalidInput("wait must be a number of seconds >= 0")
        if host is not None and (not isinstance(host, str) or not 1 <= len(host) <= HOST_MAX):
            raise InvalidInput(f"host: 1 to {HOST_MAX} characters")
        self.stats["leases"] += 1
        self._groups[worker_id] = member_of
        self._groups.move_to_end(worker_id)
        while len(self._groups) > WORKERS_KEPT:
            self._groups.popitem(last=False)
        now = await self._now()
        if await self._check_in(worker_id, names, member_of, max_tasks, host, pid, running, now):
            return Lease([], stop_requested=True)
        deadline = self.clock.monotonic() + min(float(wait), self.max_wait)
        pause = _POLL_FIRST
        while True:
            await self._maintain(now)
            # a limit set or removed meanwhile applies from here (re-read every limits_interval)
            await self.limiter.maybe_refresh(names, self.clock.monotonic())
            # Shielded: a caller that goes away mid-claim (its HTTP client disconnected) must not
            # leave what the store gave it to run out its lease (a retry each): given back at once
            claim = asyncio.ensure_future(self._claim(worker_id, names, member_of, max_tasks, host, pid, now))
            try:
                claimed = await asyncio.shield(claim)
            except asyncio.CancelledError:
                await self._give_back(worker_id, claim)
                raise
            if claimed or self.clock.monotonic() >= deadline:
                return Lease(claimed, claimed_at=now)
            if await self._wait_for_work(worker_id, names, member_of, deadline, pause):
                pause = _POLL_FIRST  # a hint came: the next poll, if any, starts short again
            else:
                pause = min(pause * 2, self.poll_interval)
            now = self.clock.now()

    async def _give_back(self, worker_id: str, claim: asyncio.Future[list[ClaimedTask]]) -> None:
        """Wait for a claim cut off by a cancel, then release what it took."""
        try:
            claimed = await asyncio.shield(claim)
        except asyncio.CancelledError:  # cancelled again: let the claim land on its own
            claim.add_done_callback(
                lambda done: (
                    None
                    if done.cancelled() or done.exception()
                    else asyncio.ensure_future(self.release(worker_id, done.result()))
                )
            )
            raise
        except MSchedulerError:
            return  # it failed: nothing to give back (an applied claim runs out its lease)
        await self.release(worker_id, claimed)

    async def release(self, worker_id: str, tasks: Sequence[ClaimedTask]) -> None:
        """Give back leased attempts whose answer could not be delivered (the executor went away
        before it): each is finished ``released`` at once — not counted, its slot freed — rather
        than left to run out its lease and cost a retry."""
        if not tasks:
            return
        now = await self._now()
        error = error_dict("Cancelled", "the lease's answer could not be delivered (the executor went away)")
        releases = []
        for task in tasks:
            self._held.pop((task.key, task.attempt), None)
            params = FinishParams(
                task.key, worker_id, task.attempt, now, AttemptStatus.RELEASED.value, None, dict(error)
            )
            releases.append(self._settle(params, task.slot))
        await asyncio.gather(*releases)
        log.info(
            "executor %s went away before its lease's answer: %d attempts released", worker_id, len(tasks)
        )

    async def _check_in(
        self,
        worker_id: str,
        names: list[str],
        groups: Sequence[str],
        max_tasks: int,
        host: str | None,
        pid: int,
        running: int,
        now: datetime,
    ) -> bool:
        """Register the executor at its first lease, heartbeat later ones (at most every
        ``heartbeat_interval``); True when an operator asked it to stop (it is unregistered:
        a later lease registers it afresh)."""
        mono = self.clock.monotonic()
        last = self._workers.get(worker_id)
        if last is None:
            # another API server may have registered it already, and an operator asked it to
            # stop since: the registration keeps that stop and says so
            info = WorkerInfo(worker_id, host or "remote", int(pid), names, max_tasks, now, groups)
            stop = await self.driver.register_worker(info)
        elif mono - last >= self.heartbeat_interval:
            stop = await self.driver.heartbeat_worker(worker_id, now, max(0, int(running)))
        else:
            return False
        if stop:
            self._workers.pop(worker_id, None)
            await self.driver.unregister_worker(worker_id, now)
            log.info("executor %s: stop requested through the database", worker_id)
            return True
        self._workers[worker_id] = mono
        self._workers.move_to_end(worker_id)
        while len(self._workers) > WORKERS_KEPT:
            self._workers.popitem(last=False)
        return False

    async def _maintain(self, now: datetime, *, force: bool = False) -> None:
        """Mark expired leases lost and tasks past their deadline expired, at most every
        ``maintenance_interval`` (a consumer's poller does the same)."""
        mono = self.clock.monotonic()
        if (
            not force
            and self._maintained_at is not None
            and mono - self._maintained_at < self.maintenance_interval
        ):
            return
        self._maintained_at = mono
        await self.driver.expire_leases(ExpireParams(now))
        await self.driver.expire_deadlines(ExpireParams(now))

    async def _claim(
        self,
        worker_id: str,
        names: list[str],
        groups: tuple[str, ...],
        max_tasks: int,
        host: str | None,
        pid: int,
        now: datetime,
    ) -> list[ClaimedTask]:
        rotation = self._rotation(names)
        await self._read_lanes(names, rotation)
        exhausted: list[str | None] = []
        params = ClaimParams(
            worker_id=worker_id,
            names=names,
            now=now,
            attempts=[secrets.token_hex(8) for _ in range(max_tasks)],
            host=host,
            pid=int(pid) or None,
            groups=groups,
            lanes=rotation.turns(max_tasks),
            exhausted=exhausted,
        )
        # limited names: slots first, then the claim with the grants (mscheduler.runtime.consumer.limiter)
        claimed = await self.limiter.claim(params, self.driver.claim)
        rotation.claimed((task.lane, task.claim_priority) for task in claimed)
        rotation.exhausted(exhausted)
        for task in claimed:
            self._remember(task.key, task.attempt, task.option, task.slot)
            if self.events is not None:
                self.events.attempt_event(
                    EventKind.CLAIMED,
                    task.key,
                    task.name,
                    task.attempt,
                    task.attempt_no,
                    worker_id,
                    generation=task.generation,
                )
        self.stats["claimed"] += len(claimed)
        await self._flush_events()
        return claimed

    def _rotation(self, names: Sequence[str]) -> FairRotation:
        """The fairness rotation of the leases of ``names`` (kept for the last ``ROTATIONS_KEPT``
        name sets)."""
        key = frozenset(names)
        rotation = self._rotations.get(key)
        if rotation is None:
            rotation = self._rotations[key] = FairRotation(self.fairness)
            while len(self._rotations) > ROTATIONS_KEPT:
                self._rotations.popitem(last=False)
        self._rotations.move_to_end(key)
        return rotation

    async def _read_lanes(self, names: list[str], rotation: FairRotation, *, force: bool = False) -> None:
        """Read the lanes (fairness keys) with claimable tasks of ``names`` into their rotation,
        unless read less than ``poll_interval`` ago (``force``: read now): leases that never
        wait learn of the keys too, at one ``distinct`` a poll interval per set of names."""
        now = self.clock.monotonic()
        if not force and rotation.read_at is not None and now - rotation.read_at < self.poll_interval:
            return
        rotation.refresh(await self.driver.find_lanes(LaneParams(names, limit=self.fairness.max_lanes)))
        rotation.read_at = now

    async def _wait_for_work(
        self, worker_id: str, names: list[str], groups: tuple[str, ...], deadline: float, pause: float
    ) -> bool:
        """Wait until a claim may succeed: a change event that concerns this executor, the next
        claim or lease-expiry time the store knows of, the end of a flow limit's backoff or a slot
        of it freed here, a poll pause, or the deadline. True when woken by a hint rather than by
        the pause."""
        now = self.clock.now()
        rotation = self._rotation(names)
        await self._read_lanes(names, rotation, force=True)
        wakeups = await self.driver.find_wakeups(
            WakeupParams(worker_id, names, now, limit=WAKEUPS_READ, groups=groups, lanes=rotation.lanes)
        )
        # Times already past say nothing new (the claim just found nothing it may take; for a
        # limited name, perhaps because its limit is full: the limit's retry time covers that).
        times = [w.time for w in wakeups if w.time > now]
        bell = self._bell(frozenset(names))
        tokens = frozenset(claimer_tokens(names, worker_id, groups))
        limits = frozenset(self.limiter.limits_of(names))
        # A limit that refused is asked again once its backoff ends. Only a future end counts: a
        # past one is a limit the claim did not reach this time (its attempts were used up).
        retry = self.limiter.next_retry(set(limits)) if limits else None
        retry = retry if retry is not None and retry > now else None
        waiter = _Waiter(worker_id, tokens, rotation, next_at=min(times) if times else None, limits=limits)
        bell.add(waiter)
        try:
            while True:
                now = self.clock.now()
                left = deadline - self.clock.monotonic()
                floor = self.stream_poll_interval if bell.streaming else pause
                timeout = min(left, floor)
                if waiter.ready or (retry is not None and retry <= now):
                    return True  # a task is claimable, or a limit may grant a slot, now
                if retry is not None:
                    timeout = min(timeout, (retry - now).total_seconds())
                if waiter.next_at is not None:
                    if waiter.next_at <= now:
                        await self._maintain(now, force=True)  # a lease may have expired
                        return True
                    timeout = min(timeout, (waiter.next_at - now).total_seconds())
                if timeout <= 0:
                    return False
                waiter.wake.clear()
                if not await self._sleep_or_wake(waiter.wake, timeout):
                    # the pause (or the deadline) passed: a known time may have come
                    now = self.clock.now()
                    if waiter.next_at is not None and waiter.next_at <= now:
                        continue
                    return False  # (a limit's retry time that came: claimed again the same way)
                if waiter.ready or waiter.next_at is None or waiter.next_at <= self.clock.now():
                    return True
                # else the event only announced a later time: wait for it
        finally:
            bell.remove(waiter)
            if not bell.waiters and self._bells.get(bell.names) is bell:
                del self._bells[bell.names]  # no watch, no entry: name sets do not pile up

    async def _sleep_or_wake(self, wake: asyncio.Event, seconds: float) -> bool:
        await sleep_unless(self.clock, seconds, wake)
        return wake.is_set()

    def _bell(self, names: frozenset[str]) -> _Doorbell:
        bell = self._bells.get(names)
        if bell is None or bell.loop is not asyncio.get_running_loop():
            bell = self._bells[names] = _Doorbell(self.driver, self.clock, names)
        return bell

    def _remember(self, key: str, attempt: str, option: Mapping[str, Any], slot: str | None) -> None:
        self._held[(key, attempt)] = _Held(dict(option), slot)
        self._held.move_to_end((key, attempt))
        while len(self._held) > OPTIONS_KEPT:
            self._held.popitem(last=False)

    def _slot_freed(self, limit_key: str) -> None:
        """A report through this service freed a slot of a limit that had refused: the leases
        waiting on it claim again now rather than at the end of their backoff."""
        for bell in self._bells.values():
            for waiter in bell.waiters:
                if limit_key in waiter.limits:
                    waiter.ready = True
                    waiter.wake.set()

    # -- ping -------------------------------------------------------------------------------------

    async def ping(
        self, worker_id: str, items: Sequence[AttemptPing], *, groups: Sequence[str] | None = None
    ) -> list[PingAnswer]:
        """Renew the leases of ``worker_id``'s running attempts in one write (fenced: only an
        unexpired running entry of this worker and attempt is renewed), with their checkpoints
        and progress. Each answer says whether to go on. ``groups``: the executor's groups (a
        task aimed at a group it is not in is ``revoked``, as for a consumer); None: those of its
        last lease through this service (none if it leased elsewhere: give them)."""
        worker_id = check_worker_id(worker_id)
        member_of = self._groups.get(worker_id, ()) if groups is None else checked_groups(groups)
        reports = self._checked_reports(items)
        self.stats["pings"] += 1
        now = await self._now()
        held = await self._held_of(worker_id, items, now)
        by_expire: dict[datetime, dict[str, str]] = {}
        slots: dict[str, dict[str, datetime]] = {}
        for item in items:
            attempt_held = held.get(item.key)
            if attempt_held is None:
                continue  # no such task: lost
            expire = now + timedelta(milliseconds=attempt_held.option["worker_timeout_ms"])
            by_expire.setdefault(expire, {})[item.key] = item.attempt
            if attempt_held.slot is not None:
                slots.setdefault(attempt_held.slot, {})[item.attempt] = expire
        renew, gone = await self._extend_slots(now, worker_id, by_expire, slots)
        result = await self.driver.ping(PingParams(worker_id, now, renew, reports, worker_groups=member_of))
        recorded = set(result.recorded)
        answers = []
        settles: list[Awaitable[None]] = []
        for item in items:
            option = result.alive.get(item.key) if item.attempt not in gone else None
            if option is not None:
                slot = held[item.key].slot
                self._remember(item.key, item.attempt, option, slot)
                answers.append(
                    PingAnswer(
                        item.key,
                        item.attempt,
                        "alive",
                        now + timedelta(milliseconds=option["worker_timeout_ms"]),
                        option["ping_interval_ms"] / 1000,
                        item.key in recorded,
                    )
                )
                continue
            state = "lost"
            for name, keys in (
                ("revoked", result.revoked),
                ("cancelled", result.cancelled),
                ("paused", result.paused),
            ):
                if item.key in keys:
                    state = name
            gone_held = self._held.pop((item.key, item.attempt), None) or held.get(item.key)
            slot = gone_held.slot if gone_held is not None and item.attempt not in gone else None
            settled = _SETTLED_AT_THE_ANSWER.get(state)
            if settled is not None:
                # Told to stop (the executor reports nothing): the attempt is settled here, as a
                # consumer settles it once its handler stopped (fenced; its slot released with
                # the write), rather than left holding the task until its lease runs out.
                settle = FinishParams(item.key, worker_id, item.attempt, now, settled[0], None, settled[1]())
                settles.append(self._settle(settle, slot))
            elif slot is not None:
                # the attempt ended without an outcome: its slot goes back (the consumer's rule)
                self.limiter.release(slot, worker_id, item.attempt)
            answers.append(PingAnswer(item.key, item.attempt, state))
        if settles:
            await asyncio.gather(*settles)
        if self.limiter.releases:
            self._finisher_here().kick()
        return answers

    def _checked_reports(self, items: Sequence[AttemptPing]) -> dict[str, AttemptReport]:
        """A ping's items checked (``InvalidInput``, nothing written): the checkpoints and
        progress to record, by key."""
        if not 1 <= len(items) <= MAX_PINGS:
            raise InvalidInput(f"a ping names 1 to {MAX_PINGS} attempts")
        if len({item.key for item in items}) != len(items):
            raise InvalidInput("a ping names each task once")
        reports: dict[str, AttemptReport] = {}
        for item in items:
            validate_key_input(item.key)
            _check_attempt(item.attempt)
            checkpoint = None
            if item.save_checkpoint:
                checkpoint = checked_checkpoint(item.checkpoint, self.max_checkpoint_bytes)
            progress = None
            if item.progress is not None:
                progress = checked_progress(item.progress.get("fraction"), item.progress.get("message"))
            if item.save_checkpoint or progress is not None:
                self._seq += 1
                reports[item.key] = AttemptReport(self._seq, item.save_checkpoint, checkpoint, progress)
        return reports

    async def _extend_slots(
        self,
        now: datetime,
        worker_id: str,
        by_expire: dict[datetime, dict[str, str]],
        slots: dict[str, dict[str, datetime]],
    ) -> tuple[dict[datetime, dict[str, str]], set[str]]:
        """The slots first, to the same expiry as the leases (the consumer's pinger does the
        same): a lease is never renewed past its slot. Returns the leases to renew (those whose
        slot is gone are not: lost) and the attempts whose slot is gone."""
        gone: set[str] = set()
        if slots:
            gone, unknown = await self.limiter.extend(now, worker_id, slots)
            if unknown:  # not confirmed: renew nothing; the executor pings again (503)
                raise StorageError(
                    "could not extend the flow-limit slots of the pinged attempts", transient=True
                )
            self.stats["slot_lost"] += len(gone)
        renew = {
            expire: {k: a for k, a in attempts.items() if a not in gone}
            for expire, attempts in by_expire.items()
        }
        return {expire: attempts for expire, attempts in renew.items() if attempts}, gone

    async def _settle(self, params: FinishParams, slot: str | None) -> None:
        """Write the settlement of an attempt a ping told to stop; a failure is left to the lease
        pass (it settles the attempt the same way at its lease's end)."""
        try:
            await self._finish(params, slot)
        except StorageError as exc:
            if exc.config:
                raise
            log.warning("could not settle the stopped attempt %s of %s: %s", params.attempt, params.key, exc)

    async def _held_of(self, worker_id: str, items: Sequence[AttemptPing], now: datetime) -> dict[str, _Held]:
        """The option (lease length) and the slot's limit of each pinged attempt: remembered from
        the lease or the last ping through this service, else read — one read of the tasks and
        one of the slots they hold (``held_slots``: the store's record, right whatever server
        leased them; an attempt without a live slot there has no lease to renew either, as a
        lease never outlives its slot)."""
        known = {i.key: h for i in items if (h := self._held.get((i.key, i.attempt))) is not None}
        missing = [i for i in items if i.key not in known]
        if missing:
            docs = await self.driver.get_tasks([i.key for i in missing])
            slot_of = await self.driver.held_slots(worker_id, [i.attempt for i in missing], now)
            options = {doc["key"]: dict(doc["option"]) for doc in docs}
            for item in missing:
                if item.key in options:
                    known[item.key] = _Held(options[item.key], slot_of.get(item.attempt))
        return known

    # -- report -----------------------------------------------------------------------------------

    async def report(self, worker_id: str, key: str, attempt: str, report: AttemptResult) -> Reported:
        """Record an attempt's outcome by the consumer's rules (``mscheduler.domain.outcomes``). Raises
        ``LeaseLost`` (nothing written) when the attempt no longer holds the task (its lease expired
        or was taken over, the task was cancelled or paused) — saying why only to the worker whose
        attempt it is: no such task and another worker's attempt are answered alike
        (``no_attempt``), so a report cannot tell whether a task exists or what its status is."""
        worker_id = check_worker_id(worker_id)
        validate_key_input(key)
        _check_attempt(attempt)
        _check_report(report)
        self.stats["reports"] += 1
        now = await self._now()
        doc: dict[str, Any] | None = None
        if report.outcome == "failed":  # the retry policy and the budget need the task's state
            doc = await self.driver.get_task(key)
            if doc is None or _entry(doc, worker_id, attempt) is None:
                raise no_attempt(key, worker_id)
        outcome = self._outcome(report, doc, worker_id, attempt, now)
        params = FinishParams(
            key,
            worker_id,
            attempt,
            now,
            outcome.status,
            outcome.result,
            outcome.error,
            outcome.retry_at,
            outcome.final,
        )
        accepted = await self._finish(params, await self._slot_of(worker_id, key, attempt, now))
        self._held.pop((key, attempt), None)
        duplicate = False
        if not accepted:
            doc = await self.driver.get_task(key)
            duplicate = self._refused(doc, key, worker_id, attempt, outcome)
        if self.events is not None and not duplicate:
            if doc is None:  # what the event names: the task's name, the attempt's number
                doc = await self.driver.get_task(key)
            self._record_outcome(doc, key, worker_id, attempt, outcome)
            await self._flush_events()
        return Reported(key, attempt, outcome, duplicate)

    def _outcome(
        self,
        report: AttemptResult,
        doc: Mapping[str, Any] | None,
        worker_id: str,
        attempt: str,
        now: datetime,
    ) -> Outcome:
        if report.outcome == "succeeded":
            return succeeded(report.result, self.max_result_bytes)
        if report.outcome == "released":
            return Outcome(
                AttemptStatus.RELEASED.value,
                error=error_dict("Cancelled", report.message or "attempt released by the executor"),
            )
        if report.outcome == "snoozed":
            after = timedelta(seconds=report.retry_after or 0.0)
            return snoozed(report.message or f"snoozed for {after}", after, now)
        # the reported type is stored as it is; without one, what a Python handler's would be
        default = "Fail" if report.final else "Retry" if report.retry_after is not None else "ExecutorError"
        error = error_dict(report.error_type or default, report.message, report.traceback)
        if report.final:
            return fail_for_good(error)
        if report.retry_after is not None:
            return retry_after(error, timedelta(seconds=report.retry_after), now)
        assert doc is not None
        entry = _entry(doc, worker_id, attempt)
        if entry is None:  # not this worker's attempt: the fenced finish refuses it anyway
            return Outcome(AttemptStatus.FAILED.value, error=error, retry_at=now)
        return failed(error, doc["option"], _failures_before(doc, entry), now, self.rng)

    async def _slot_of(self, worker_id: str, key: str, attempt: str, now: datetime) -> str | None:
        """The flow limit whose slot the attempt holds (to release it with the outcome):
        remembered from its lease or last ping here, else read from the store."""
        held = self._held.get((key, attempt))
        if held is not None:
            return held.slot
        return (await self.driver.held_slots(worker_id, [attempt], now)).get(attempt)

    def _finisher_here(self) -> _Finisher:
        finisher = self._finisher
        if finisher is None or finisher.loop is not asyncio.get_running_loop():
            finisher = self._finisher = _Finisher(self.driver, self.limiter, self.clock)
        return finisher

    async def _finish(self, params: FinishParams, slot: str | None) -> bool:
        return await self._finisher_here().submit(params, slot)

    async def aclose(self) -> None:
        """Write what is waiting (outcomes, slot releases) before the server stops; slots whose
        release fails run out at their expiry."""
        finisher = self._finisher
        if finisher is None or finisher.loop is not asyncio.get_running_loop():
            return
        await finisher.idle()
        if self.limiter.releases:
            await self.limiter.flush(self.clock.now(), everything=True)

    def _refused(
        self, doc: Mapping[str, Any] | None, key: str, worker_id: str, attempt: str, outcome: Outcome
    ) -> bool:
        """Why the store refused a report: True when this very outcome was recorded already (a
        report sent again), else the error to answer with."""
        entry = _entry(doc, worker_id, attempt) if doc is not None else None
        if entry is not None and entry["status"] == outcome.status:
            return True
        self.stats["refused"] += 1
        if doc is None or entry is None:
            raise no_attempt(key, worker_id)
        state = doc["state"]
        if entry["status"] == "running":
            why = f"the lease of attempt {attempt!r} expired at {entry['ping_expire_time'].isoformat()}"
        else:
            why = f"attempt {attempt!r} is {entry['status']} (its lease moved on)"
        if state.get("cancelled") is not None:
            why += "; the task was cancelled"
        raise LeaseLost(f"task {key!r} ({state['status']}): {why}; the outcome was not recorded")

    def _record_outcome(
        self, doc: Mapping[str, Any] | None, key: str, worker_id: str, attempt: str, outcome: Outcome
    ) -> None:
        assert self.events is not None
        entry = _entry(doc, worker_id, attempt) if doc is not None else None
        fail_cnt = len(_failures_before(doc, entry)) if doc is not None and entry is not None else 0
        option = doc["option"] if doc is not None else {"max_unexpected_retries": None}
        final_for_good = fails_for_good(option, fail_cnt, outcome.status, outcome.error, outcome.final)
        kind = outcome_kind(outcome.status, final_for_good)
        if kind is None:
            return
        name = doc["name"] if doc is not None else ""
        attempt_no = generation = 0
        if doc is not None:
            positions = [n for n, e in enumerate(doc["state"]["worker_states"], 1) if e["attempt"] == attempt]
            attempt_no = positions[0] if positions else 0
            generation = int(doc["state"].get("generation") or 0)
        detail = outcome_detail(outcome.error, outcome.retry_at)
        self.events.attempt_event(kind, key, name, attempt, attempt_no, worker_id, detail, generation)

    async def _flush_events(self) -> None:
        if self.events is None or not len(self.events):
            return
        try:
            await self.events.flush()
        except MSchedulerError as exc:  # the event log is a record, not the work: go on
            log.warning("could not write executor events: %s", exc)


def _checked_names(names: Sequence[str]) -> list[str]:
    if isinstance(names, str) or not names or len(names) > 100:
        raise InvalidInput("names: a list of 1 to 100 task names")
    try:
        return sorted({validate_name(n) for n in names})
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def checked_groups(groups: Sequence[str]) -> tuple[str, ...]:
    """Distinct valid group names (``Consumer(groups=...)``'s rule), at most ``MAX_GROUPS``."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence) or len(groups) > MAX_GROUPS:
        raise InvalidInput(f"groups: a list of at most {MAX_GROUPS} group names")
    try:
        return tuple(dict.fromkeys(validate_group(g) for g in groups))
    except ValueError as exc:
        raise InvalidInput(f"groups: {exc}") from None


def validate_key_input(key: str) -> str:
    try:
        return validate_key(key)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _check_attempt(attempt: object) -> None:
    if not isinstance(attempt, str) or not 1 <= len(attempt) <= 64 or attempt.startswith("$"):
        raise InvalidInput("attempt: the attempt token the lease gave (1 to 64 characters)")


def _check_report(report: AttemptResult) -> None:
    if report.outcome not in REPORT_OUTCOMES:
        raise InvalidInput(f"outcome must be one of {', '.join(REPORT_OUTCOMES)}")
    after = report.retry_after
    if after is not None and (not math.isfinite(after) or not 0 <= after <= 366 * 86400):
        raise InvalidInput("retry_after: seconds from 0 to 366 days")
    if report.outcome == "snoozed" and after is None:
        raise InvalidInput("a snoozed report needs retry_after (seconds until the task may run again)")
    if report.outcome in ("succeeded", "released") and (after is not None or report.final):
        raise InvalidInput(f"retry_after and final go with failed (or snoozed) reports, not {report.outcome}")
    if report.outcome == "snoozed" and report.final:
        raise InvalidInput("final goes with failed reports only")
    if report.final and after is not None:
        raise InvalidInput("a final failure has no retry_after")
    if report.outcome != "succeeded" and report.result is not None:
        raise InvalidInput("a result goes with succeeded reports only")


def no_attempt(key: str, worker_id: str) -> LeaseLost:
    """The answer to a report of an attempt this worker does not hold on the task: the same
    whether the task exists or not, and whatever its status (nothing to learn by probing)."""
    return LeaseLost(
        f"worker {worker_id!r} holds no such attempt on task {key!r}; the outcome was not recorded"
    )


def _entry(doc: Mapping[str, Any], worker_id: str, attempt: str) -> dict[str, Any] | None:
    for entry in doc["state"]["worker_states"]:
        if entry["attempt"] == attempt and entry["worker_id"] == worker_id:
            return dict(entry)
    return None


def _failures_before(doc: Mapping[str, Any], entry: Mapping[str, Any]) -> list[datetime]:
    """The counted failures the claim of ``entry`` saw (``ClaimedTask.failure_times``): those
    that ended before it started, oldest first."""
    start = entry["start_time"]
    return sorted(
        e["end_time"]
        for e in doc["state"]["worker_states"]
        if e["status"] in FAILURE_STATUSES and e.get("end_time") is not None and e["end_time"] <= start
    )
