"""Discovery: a bounded heap of times at which known tasks may become claimable.

Sources: a batch query at start and on every poll tick (the floor), and change-stream events
(hints that only make things faster). The claimer sleeps until the earliest time or a wake-up.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from mscheduler.domain.clock import Clock, sleep_unless
from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.fairness import Fairness, FairRotation
from mscheduler.domain.state import LANE_MARK, claimer_tokens, laneless, token_lane
from mscheduler.drivers.base import (
    ChangeEvent,
    ChangeStreamUnsupported,
    Driver,
    ExpireParams,
    LaneParams,
    ResumeTokenLost,
    StreamPosition,
    Wakeup,
    WakeupParams,
)

log = logging.getLogger("mscheduler.consumer")

CLAIM = "claim"
LEASE = "lease"
DEADLINE = "deadline"  # a known task's deadline: the deadline pass runs then
# Polls in any one poll interval, whatever is due or asked for: a poll that would be one more
# waits until the oldest of them is an interval old (bounds a loop in which each poll finds
# something that makes someone ask for the next one at once; a poll asked for after a quiet
# while, say when a change stream broke, still runs at once).
POLLS_PER_INTERVAL = 4


class WakeupQueue:
    """Times at which known tasks become claimable; one entry per (key, kind), latest info wins."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._heap: list[tuple[datetime, str, str]] = []
        self._times: dict[tuple[str, str], datetime] = {}
        self._lanes: dict[str, str] = {}  # key -> the fairness key of a claim wake-up (if it has one)
        self.overflowed = False
        self.changed = asyncio.Event()
        # the lanes of the claim wake-ups ``pop_due`` took (the claimer's rotation visits them)
        self.due_lanes: set[str | None] = set()

    def __len__(self) -> int:
        return len(self._times)

    def push(self, key: str, when: datetime, kind: str, lane: str | None = None) -> None:
        ident = (key, kind)
        if kind == CLAIM and ident in self._times:
            self._set_lane(key, lane)
        if self._times.get(ident) == when:
            return
        if ident not in self._times and len(self._times) >= self.max_size:
            self.overflowed = True  # forget it: the next poll finds it again
            return
        if kind == CLAIM:
            self._set_lane(key, lane)
        self._times[ident] = when
        heapq.heappush(self._heap, (when, key, kind))
        if len(self._heap) > 4 * self.max_size:
            self._compact()
        self.changed.set()

    def _set_lane(self, key: str, lane: str | None) -> None:
        if lane is None:
            self._lanes.pop(key, None)
        else:
            self._lanes[key] = lane

    def discard(self, key: str, kind: str) -> None:
        self._times.pop((key, kind), None)
        if kind == CLAIM:
            self._lanes.pop(key, None)

    @property
    def heap_size(self) -> int:
        """Heap entries, stale ones included (at most 4 x ``max_size`` + 1)."""
        return len(self._heap)

    def _compact(self) -> None:
        self._heap = [(t, k, kind) for (k, kind), t in self._times.items()]
        heapq.heapify(self._heap)

    def _clean_top(self) -> tuple[datetime, str, str] | None:
        heap = self._heap
        while heap:
            when, key, kind = heap[0]
            if self._times.get((key, kind)) == when:
                return heap[0]
            heapq.heappop(heap)
        return None

    def next_time(self) -> datetime | None:
        top = self._clean_top()
        return top[0] if top else None

    def pop_due(self, now: datetime) -> dict[str, set[str]]:
        """Remove every entry due at ``now``; returns the keys that were due, by kind."""
        kinds: dict[str, set[str]] = {}
        while (top := self._clean_top()) is not None and top[0] <= now:
            heapq.heappop(self._heap)
            del self._times[(top[1], top[2])]
            kinds.setdefault(top[2], set()).add(top[1])
            if top[2] == CLAIM:
                self.due_lanes.add(self._lanes.pop(top[1], None))
        return kinds

    def due(self, now: datetime) -> bool:
        when = self.next_time()
        return when is not None and when <= now


class Discovery:
    """Keeps the wake-up queue filled from a change stream, with polling as the floor."""

    def __init__(
        self,
        driver: Driver,
        clock: Clock,
        *,
        worker_id: str,
        names: Sequence[str],
        poll_interval: float,
        stream_poll_interval: float,
        batch_size: int,
        max_size: int,
        on_event: Callable[[str, dict[str, Any]], None],
        on_stop: Callable[[ChangeEvent], None] | None = None,
        groups: Sequence[str] = (),
        excluded: Callable[[str], bool] | None = None,
        fairness: Fairness | None = None,
    ) -> None:
        self.driver = driver
        self.clock = clock
        self.worker_id = worker_id
        self.names = list(names)
        self.groups: list[str] = list(groups)
        self.poll_interval = poll_interval
        self.stream_poll_interval = stream_poll_interval
        self.batch_size = batch_size
        self.queue = WakeupQueue(max_size)
        self.streaming = False  # a change stream is open and healthy
        self.stream_supported: bool | None = None
        self.resume_token: Any = None
        self.page_full = False  # the last poll found as many claimable tasks as it asked for
        self._poll_now = asyncio.Event()
        self._emit = on_event
        self._on_stop = on_stop  # told of events that stop running attempts (ChangeEvent.stop)
        # deadlines of known tasks, earliest first: the poller runs the deadline pass at each,
        # not only at its next poll, so a task past its deadline is marked expired then
        self.deadlines: list[tuple[datetime, str]] = []
        self._deadline_of: dict[str, datetime] = {}
        self._rearm = asyncio.Event()
        self._mine: dict[str, frozenset[str]] = {}  # per task name: the claimer tokens that are ours
        # the lanes (fairness keys) with claimable tasks, in the claimer's visiting order
        self.rotation = FairRotation(fairness or Fairness())
        # keys the claimer leaves out of its claims (running here, fan-outs it ran): a poll that
        # queued them would wake it for a claim that takes nothing, poll after poll
        self._excluded = excluded
        self.polls = 0  # poll_once calls (tests count them)
        # monotonic times of the last polls (as many as may run in one poll interval)
        self._recent_polls: deque[float] = deque(maxlen=POLLS_PER_INTERVAL)

    def push_wakeups(self, wakeups: Sequence[Wakeup]) -> None:
        excluded = self._excluded
        for w in wakeups:
            if w.kind == DEADLINE:
                self.note_deadline(w.key, w.time)
            elif excluded is None or not excluded(w.key):
                self.queue.push(w.key, w.time, w.kind, w.lane)

    def due_at(self, key: str, when: datetime) -> None:
        """This consumer wrote a due time itself (a retry or a snooze): queue it, so that a store
        without change streams does not wait for the next poll."""
        self.queue.push(key, when, CLAIM)

    def note_deadline(self, key: str, when: datetime) -> None:
        if self._deadline_of.get(key) == when:
            return
        if key not in self._deadline_of and len(self._deadline_of) >= self.queue.max_size:
            return  # bounded like the queue: the next poll runs the pass anyway
        self._deadline_of[key] = when
        if len(self.deadlines) > 2 * self.queue.max_size:  # stale entries of replaced deadlines
            self.deadlines = [(t, k) for k, t in self._deadline_of.items()]
            heapq.heapify(self.deadlines)
        heapq.heappush(self.deadlines, (when, key))
        self._rearm.set()  # the poller re-arms its sleep for it

    def _next_deadline(self) -> datetime | None:
        while self.deadlines and self._deadline_of.get(self.deadlines[0][1]) != self.deadlines[0][0]:
            heapq.heappop(self.deadlines)  # stale: a later note replaced it
        return self.deadlines[0][0] if self.deadlines else None

    async def expire_due_deadlines(self, now: datetime) -> int:
        """The deadline pass, when a known deadline has come (one ``expire_deadlines``)."""
        due = False
        while (when := self._next_deadline()) is not None and when <= now:
            _, key = heapq.heappop(self.deadlines)
            del self._deadline_of[key]
            due = True
        if not due:
            return 0
        expired = await self.driver.expire_deadlines(ExpireParams(now))
        if expired:
            self._emit("deadlines_expired", {"count": expired})
        return expired

    def on_change(self, event: ChangeEvent) -> None:
        if event.stop is not None and self._on_stop is not None:
            self._on_stop(event)
        if event.claimers is not None:
            mine = self._mine.get(event.name)
            if mine is None:
                mine = self._mine[event.name] = frozenset(
                    claimer_tokens([event.name], self.worker_id, self.groups)
                )
            claimers = event.claimers
            # a task with a fairness key: its tokens carry it (name#key|who); most carry none
            keyed = any(LANE_MARK in token for token in claimers)
            if mine.isdisjoint([laneless(t) for t in claimers] if keyed else claimers):
                if event.claimers_complete:  # else others than those listed may claim: no news
                    self.queue.discard(event.key, CLAIM)
            else:
                # claimable by us; no claim_at in the event: its time did not change (due now
                # or known already), so try now
                now = self.clock.now()
                lane = token_lane(claimers[0]) if keyed else None
                if event.claim_at is None or event.claim_at <= now:
                    self.rotation.seen(lane, event.priority)
                self.queue.push(event.key, event.claim_at or now, CLAIM, lane)
        elif (
            event.specific_worker_ids and self.worker_id not in event.specific_worker_ids and not self.groups
        ):
            # aimed at others (a member of a group may still be named by the task's groups, which
            # an event without claimers does not carry: it keeps its wake-up)
            self.queue.discard(event.key, CLAIM)
        elif event.claim_at is not None:
            self.queue.push(event.key, event.claim_at, CLAIM)
        else:
            self.queue.discard(event.key, CLAIM)
        if event.lease_expiry is not None:
            self.queue.push(event.key, event.lease_expiry, LEASE)
        else:
            self.queue.discard(event.key, LEASE)
        if event.deadline is not None:
            self.note_deadline(event.key, event.deadline)

    def structure_sizes(self) -> dict[str, int]:
        """Entries of the wake-up queue and the deadline heap (each bounded by the queue's
        ``max_size``; docs/design.md, "Steady state")."""
        return {
            "wakeup_queue": len(self.queue),
            "wakeup_heap": self.queue.heap_size,
            "deadline_heap": len(self.deadlines),
            "deadlines_known": len(self._deadline_of),
            "claimer_tokens": len(self._mine),
        }

    def request_poll(self) -> None:
        self._poll_now.set()

    async def poll_once(self) -> None:
        """The floor: mark expired leases lost, then read a batch of upcoming claim times."""
        self.polls += 1
        self._recent_polls.append(self.clock.monotonic())
        now = self.clock.now()
        expired = await self.driver.expire_leases(ExpireParams(now))
        if expired:
            self._emit("leases_expired", {"count": expired})
        past_deadline = await self.driver.expire_deadlines(ExpireParams(now))
        if past_deadline:
            self._emit("deadlines_expired", {"count": past_deadline})
        while (when := self._next_deadline()) is not None and when <= now:  # this pass saw to them
            del self._deadline_of[heapq.heappop(self.deadlines)[1]]
        # the lanes (fairness keys) with claimable tasks: the claimer's rotation visits them, and
        # their wake-ups are read with the others'
        lanes = await self.driver.find_lanes(LaneParams(self.names, limit=self.rotation.fairness.max_lanes))
        self.rotation.refresh(lanes)
        limit = self.batch_size
        wakeups = await self.driver.find_wakeups(
            WakeupParams(
                self.worker_id, self.names, now, limit, groups=self.groups, lanes=self.rotation.lanes
            )
        )
        self.queue.overflowed = False
        # A full page: more may be due than the queue knows of, so the claimer keeps claiming
        # while its claims come back full instead of trusting the queue's count.
        self.page_full = sum(w.kind == CLAIM for w in wakeups) >= limit
        self.push_wakeups(wakeups)
        if self.queue.due(now):
            # something is due: wake the claimer even where the queue knew the time already (a
            # due time this consumer queued itself) and its timer was armed for later
            self.queue.changed.set()
        self._emit("polled", {"found": len(wakeups)})

    async def run_poller(self) -> None:
        """Poll every interval (the consumer polled once already before starting us); in between,
        run the deadline pass when a known task's deadline comes."""
        interval = self.stream_poll_interval if self.streaming else self.poll_interval
        next_poll = self.clock.monotonic() + interval
        while True:
            sleep = max(next_poll - self.clock.monotonic(), 0.0)
            deadline = self._next_deadline()
            if deadline is not None:
                sleep = min(sleep, max((deadline - self.clock.now()).total_seconds(), 0.0))
            requested = await self._sleep_or_poll(sleep)
            try:
                if requested or self.clock.monotonic() >= next_poll:
                    await self._space_out()
                    interval = self.stream_poll_interval if self.streaming else self.poll_interval
                    next_poll = self.clock.monotonic() + interval
                    await self.poll_once()
                else:
                    await self.expire_due_deadlines(self.clock.now())
            except StorageError as exc:
                if exc.config:
                    raise
                level = logging.WARNING if exc.transient else logging.ERROR
                log.log(level, "poll failed (%s); trying again next interval", exc, extra={"error": str(exc)})

    async def _space_out(self) -> None:
        """Before a poll: when ``POLLS_PER_INTERVAL`` polls ran within the last poll interval,
        wait until the oldest of them is an interval old (a request made meanwhile is served by
        this poll)."""
        recent = self._recent_polls
        if len(recent) < POLLS_PER_INTERVAL:
            return
        if (wait := recent[0] + self.poll_interval - self.clock.monotonic()) > 0:
            await self.clock.sleep(wait)
            self._poll_now.clear()

    async def _sleep_or_poll(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less when a poll is asked for (True) or a deadline was noted
        (False: the caller re-arms its sleep for it)."""
        await sleep_unless(self.clock, seconds, self._poll_now, self._rearm)
        self._rearm.clear()
        requested = self._poll_now.is_set()
        # Cleared when the poll starts, not when the sleep does: a request made while the last
        # poll ran (its read may predate what the request is about) makes the next poll at once.
        self._poll_now.clear()
        return requested

    async def run_watcher(self) -> None:
        """Follow the change stream; reopen with backoff; give up quietly where unsupported."""
        backoff = 0.1
        while True:
            try:
                async for event in self.driver.watch(self.names, self.resume_token):
                    self.streaming = True
                    self.stream_supported = True
                    backoff = 0.1
                    self.resume_token = event.token
                    if isinstance(event, StreamPosition):
                        continue
                    try:
                        self.on_change(event)
                    except Exception as exc:  # one odd event must not stop the watcher
                        log.warning("ignoring a change event for %r: %r", getattr(event, "key", None), exc)
                        self.request_poll()
                # A stream that ends by itself was closed or invalidated: start afresh. Events
                # until the new stream opens are missed (poll now), and a stream that keeps ending
                # at once must not be reopened in a tight loop (backoff).
                self.resume_token = None
                self.streaming = False
                self.request_poll()
                await self.clock.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
            except ResumeTokenLost as exc:
                # The token is gone (history rolled off the oplog, or invalid): reopen from now
                # and poll once, since changes in between are not coming.
                log.warning("change stream cannot resume (%s); reopening from now", exc)
                self._emit("stream_broken", {"reason": str(exc)})
                self.resume_token = None
                self.streaming = False
                self.request_poll()
            except ChangeStreamUnsupported as exc:
                self.stream_supported = False
                self.streaming = False
                log.info("change streams unavailable (%s): polling every %.2fs", exc, self.poll_interval)
                self._emit("stream_unsupported", {"reason": str(exc)})
                return
            except StorageError as exc:
                if exc.config:
                    raise
                self.streaming = False
                log.warning("change stream broke (%s); reopening in %.1fs", exc, backoff)
                self._emit("stream_broken", {"reason": str(exc)})
                # Events may have been missed: poll now, then reopen from the last token.
                self.request_poll()
                await self.clock.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
