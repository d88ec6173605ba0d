"""The task event log and subscriptions to it (a plan's or task's results).

An event says what happened to a task: ``sent``, ``claimed``, ``succeeded``, ``retried``,
``failed``, ``lease_lost``, ``cancelled``, ... (``EventKind``), with the task's key and name,
the worker and attempt number where there is one, the time, and a short ``detail``.

Recording is a switch of the store (``MemoryDriver(events=True)``, ``MongoDriver(db,
events=True)``), so every publisher, consumer, planner and operator on it records:

* store writes record their events in the same driver operation: ``sent`` (``insert_tasks``),
  ``expired`` and ``lease_lost`` of the expiry passes, the operators' controls and ``edited``;
* a consumer buffers the events of its claims and outcomes (``EventRecorder``) and writes them
  in one insert per ``flush_interval`` (or ``flush_size`` events), never in the claim, ping or
  finish commands' round trips. A consumer killed before its flush loses what it buffered (at
  most ``flush_interval`` of events); the task documents, which hold every attempt, stay the
  truth (see docs/design.md).

``Events`` is the read side: ``list`` (filters, paging) and ``subscribe`` (an async iterator of
new events: the store's change stream where there is one, polling otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mscheduler.domain.clock import Clock, ServerClock, truncate_ms
from mscheduler.domain.events import (
    EventKind,
    EventWriter,
    attempt_event_id,
    error_detail,
    event_doc,
    order_key,
)
from mscheduler.domain.exceptions import InvalidInput, StorageError
from mscheduler.domain.model import validate_key, validate_name, validate_worker_id
from mscheduler.domain.plans import checked_plan_id
from mscheduler.drivers.base import Driver, EventQuery, InsertEventsParams, ResumeTokenLost
from mscheduler.drivers.streams import event_subscription

log = logging.getLogger("mscheduler.events")

__all__ = ["Event", "EventKind", "EventRecorder", "Events", "outcome_detail", "outcome_kind"]

DEFAULT_FLUSH_INTERVAL = 1.0  # seconds a consumer's events wait at most before they are written
DEFAULT_FLUSH_SIZE = 500  # events that make a flush at once
DEFAULT_MAX_BUFFER = 10_000  # events a consumer keeps while the store does not take them
LIST_LIMIT_MAX = 1000
POLL_PAGE = 50  # events a replay reads per page (then the loop turns)
DEFAULT_MAX_REPLAY = 3600.0  # seconds back a subscription's ``since`` may reach
MAX_REPLAY_LIMIT = 7 * 24 * 3600.0
# event ids a subscription remembers at most (the newest), to hand each out once: what a burst
# stores within ``poll_overlap`` beyond it may be handed out twice after a reconnection (a
# subscriber that fell behind the shared stream reads the overlap again)
MAX_SEEN = 200_000
# the events of one stored instant a replay holds back to tell them in the order they happened
REPLAY_GROUP_MAX = 5_000
RECENT_EVENTS = 4096  # events read lately, shared by this reader's subscriptions (read once)


class Event(BaseModel):
    """One recorded event (read from the store)."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: EventKind
    key: str
    name: str
    plan_id: str | None = None  # set for a plan's run tasks (keys made by ``occurrence_key``)
    worker_id: str | None = None
    attempt: int | None = None  # the attempt's number among the task's attempts (1-based)
    step: int = 0  # the order of a task's events of one time (mscheduler.domain.events.event_step)
    writer: str | None = None  # who recorded it (a store, a consumer, an API server)
    seq: int = 0  # the writer's sequence number: its events of one time and step, in order
    time: datetime  # when it happened
    written: datetime | None = None  # when it was stored (a consumer's events are buffered)
    detail: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> Event:
        return cls.model_validate(dict(doc))


class EventRecorder:
    """A consumer's buffer of events: written in one insert per ``flush_interval`` seconds (or
    as soon as ``flush_size`` are waiting), and at stop. While the store refuses them the buffer
    keeps the newest ``max_buffer`` and drops older ones (counted in ``dropped``, WARNING)."""

    def __init__(
        self,
        driver: Driver,
        clock: Clock,
        *,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        flush_size: int = DEFAULT_FLUSH_SIZE,
        max_buffer: int = DEFAULT_MAX_BUFFER,
    ) -> None:
        if not 0 < flush_interval <= 3600:
            raise InvalidInput("flush_interval must be more than 0 and at most 3600 seconds")
        if not 1 <= flush_size <= max_buffer:
            raise InvalidInput("flush_size must be at least 1 and at most max_buffer")
        self.driver = driver
        self.clock = clock
        self.writer = EventWriter()  # stamps each buffered event with this recorder's sequence
        self.flush_interval = flush_interval
        self.flush_size = flush_size
        self.max_buffer = max_buffer
        self._buffer: deque[dict[str, Any]] = deque()
        self._added = asyncio.Event()
        self._full = asyncio.Event()
        self.written = 0  # events stored (duplicates of stored ones not counted)
        self.flushes = 0
        self.dropped = 0
        self._warned = False

    def __len__(self) -> int:
        return len(self._buffer)

    def record(self, doc: dict[str, Any]) -> None:
        """Buffer one event (``events_common.event_doc``); never waits."""
        buffer = self._buffer
        buffer.append(doc)
        if len(buffer) > self.max_buffer:
            self._trim()
        self._added.set()
        if len(buffer) >= self.flush_size:
            self._full.set()

    def attempt_event(
        self,
        kind: EventKind,
        key: str,
        name: str,
        attempt: str,
        attempt_no: int,
        worker_id: str,
        detail: Mapping[str, Any] | None = None,
        generation: int = 0,
    ) -> None:
        """Buffer an attempt's event (its id: key, attempt token and kind); ``generation``: the
        task's generation when it was claimed (where the event stands: ``event_step``)."""
        self.record(
            event_doc(
                kind,
                key,
                name,
                self.clock.now(),
                writer=self.writer,
                event_id=attempt_event_id(key, attempt, kind),
                worker_id=worker_id,
                attempt=attempt_no,
                generation=generation,
                detail=detail,
            )
        )

    def _trim(self) -> None:
        while len(self._buffer) > self.max_buffer:
            self._buffer.popleft()
            self.dropped += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "event buffer full (%d): the store does not take events; dropping the oldest",
                    self.max_buffer,
                    extra={"dropped": self.dropped},
                )

    async def flush(self) -> bool:
        """Write what is buffered in one insert (a driver's ``insert_batch`` at a time where it
        has one: the memory driver's, whose insert never lets the loop turn). False if the store
        did not take it (a transient error: the events are kept for the next try); configuration
        errors are raised."""
        if not self._buffer:
            return True
        limit = getattr(self.driver, "insert_batch", None)
        while self._buffer:
            buffer = self._buffer
            batch = (
                list(buffer) if limit is None else [buffer.popleft() for _ in range(min(limit, len(buffer)))]
            )
            if limit is None:
                buffer.clear()
            if not buffer:
                self._full.clear()
            if not await self._write(batch):
                return False
            if buffer:
                await asyncio.sleep(0)  # the next part: others run between
        self.flushes += 1
        self._warned = False
        return True

    async def _write(self, batch: list[dict[str, Any]]) -> bool:
        try:
            self.written += await self.driver.insert_events(InsertEventsParams(batch, self.clock.now()))
        except StorageError as exc:
            if exc.config:
                self._buffer.extendleft(reversed(batch))
                raise
            if not exc.transient:
                self.dropped += len(batch)
                log.error("could not write %d events (%s); dropped", len(batch), exc)
                return True
            self._buffer.extendleft(reversed(batch))
            self._trim()
            log.warning("could not write %d events (%s); trying again", len(batch), exc)
            return False
        return True

    async def run(self) -> None:
        """Flush every ``flush_interval`` while events wait (or at once when ``flush_size`` do)."""
        while True:
            if not self._buffer:
                self._added.clear()
                await self._added.wait()
            if len(self._buffer) < self.flush_size:
                sleeper = asyncio.ensure_future(self.clock.sleep(self.flush_interval))
                full = asyncio.ensure_future(self._full.wait())
                try:
                    await asyncio.wait({sleeper, full}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    sleeper.cancel()
                    full.cancel()
            if not await self.flush():
                await self.clock.sleep(self.flush_interval)


def _many(values: Iterable[str] | str | None, check: Any, field: str) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, str):
        values = (values,)
    out = []
    for value in values:
        try:
            out.append(check(value))
        except (ValueError, InvalidInput) as exc:
            raise InvalidInput(f"{field}: {exc}") from exc
    return tuple(out)


def _kind(value: object) -> str:
    try:
        return EventKind(str(value)).value
    except ValueError:
        choices = ", ".join(k.value for k in EventKind)
        raise InvalidInput(f"unknown event kind {value!r} (one of {choices})") from None


def _time(value: object, field: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(f"{field}: a timezone-aware datetime")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"{field}: out of range (in UTC before year 1 or after year 9999)") from None


def checked_page(limit: object, skip: object) -> None:
    """``Events.list``'s page: ``limit`` from 1 to ``LIST_LIMIT_MAX``, ``skip`` from 0."""
    if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT_MAX:
        raise InvalidInput(f"limit: must be an integer from 1 to {LIST_LIMIT_MAX}")
    if not isinstance(skip, int) or skip < 0:
        raise InvalidInput("skip: must be a non-negative integer")


class Events:
    """Read the event log: ``list`` it, ``subscribe`` to it.

    :param driver: the store.
    :param clock: time source (by default the system clock corrected to the server's).
    :param poll_interval: seconds between reads where the store has no change stream.
    :param poll_overlap: how far back (seconds of ``written`` time) each poll reads again, for
        events whose insert was in flight while the previous poll read: longer than an insert
        with its retries takes. Events already seen are not handed out twice.
    :param max_replay: how far back (seconds) a subscription's ``since`` may reach: a replay
        reads every event stored since, so this bounds what one subscriber can ask the store
        for (older events: ``list``, a page at a time).
    """

    def __init__(
        self,
        driver: Driver,
        *,
        clock: Clock | None = None,
        poll_interval: float = 1.0,
        poll_overlap: float = 30.0,
        max_replay: float = DEFAULT_MAX_REPLAY,
    ) -> None:
        if not 0 < poll_interval <= 3600 or not 0 <= poll_overlap <= 3600:
            raise InvalidInput("poll_interval must be in (0, 3600] and poll_overlap in [0, 3600] seconds")
        if isinstance(max_replay, bool) or not isinstance(max_replay, int | float):
            raise InvalidInput("max_replay: a number of seconds")
        if not 0 < max_replay <= MAX_REPLAY_LIMIT:
            raise InvalidInput(f"max_replay: more than 0 and at most {MAX_REPLAY_LIMIT:.0f} seconds (a week)")
        self.driver = driver
        self.clock = clock if isinstance(clock, ServerClock) else ServerClock(clock)
        self.poll_interval = poll_interval
        self.poll_overlap = timedelta(seconds=poll_overlap)
        self.max_replay = timedelta(seconds=max_replay)
        # the newest events its subscriptions handed out, by id (a stored event never changes):
        # each subscriber of an event gets the same object, validated once
        self._recent: OrderedDict[str, Event] = OrderedDict()
        self._synced = False
        self.polling = False  # the last subscription fell back to polling

    async def _now(self) -> datetime:
        if not self._synced:
            await self.clock.sync(self.driver.server_time)
            self._synced = True
        return self.clock.now()

    @staticmethod
    def _query(
        keys: Iterable[str] | str | None,
        names: Iterable[str] | str | None,
        kinds: Iterable[str] | str | None,
        plans: Iterable[str] | str | None,
        worker_id: str | None = None,
    ) -> EventQuery:
        if worker_id is not None:
            try:
                validate_worker_id(worker_id)
            except ValueError as exc:
                raise InvalidInput(f"worker_id: {exc}") from None
        return EventQuery(
            keys=_many(keys, validate_key, "keys"),
            names=_many(names, validate_name, "names"),
            kinds=_many(kinds, _kind, "kinds"),
            plan_ids=_many(plans, checked_plan_id, "plans"),
            worker_id=worker_id,
        )

    async def list(
        self,
        *,
        keys: Iterable[str] | str | None = None,
        names: Iterable[str] | str | None = None,
        kinds: Iterable[str] | str | None = None,
        plans: Iterable[str] | str | None = None,
        worker_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        skip: int = 0,
    ) -> list[Event]:
        """Events in time order (then id), filtered: ``since <= time < until``; one task's
        history is ``list(keys=key)``. Paged by ``skip`` / ``limit``."""
        checked_page(limit, skip)
        base = self._query(keys, names, kinds, plans, worker_id)
        query = EventQuery(
            keys=base.keys,
            names=base.names,
            kinds=base.kinds,
            plan_ids=base.plan_ids,
            worker_id=base.worker_id,
            time_from=_time(since, "since"),
            time_to=_time(until, "until"),
            skip=skip,
            limit=limit,
        )
        return [Event.from_storage(doc) for doc in await self.driver.list_events(query)]

    def subscribe(
        self,
        *,
        names: Iterable[str] | str | None = None,
        kinds: Iterable[str] | str | None = None,
        keys: Iterable[str] | str | None = None,
        plans: Iterable[str] | str | None = None,
        since: datetime | None = None,
    ) -> AsyncIterator[Event]:
        """New events as they are stored, filtered (``plans``: the run tasks of these plans)::

            async for event in events.subscribe(plans=["nightly"], kinds=["succeeded", "failed"]):
                ...

        From now, or from events stored since ``since`` (at most ``max_replay`` back: further is
        ``InvalidInput``), read a page at a time. Each event once, none left out while it is
        within the retention: on a change stream (resumed after errors), else polling by stored
        time (``poll_interval``, re-reading ``poll_overlap``).
        """
        query = self._query(keys, names, kinds, plans)
        start = _time(since, "since")
        if start is not None and start < self.clock.now() - self.max_replay:
            reach = self.max_replay.total_seconds()
            raise InvalidInput(
                f"since: at most {reach:g} seconds back (the replay limit); list older events a "
                "page at a time instead"
            )
        return self._subscribe(query, start)

    async def _subscribe(self, query: EventQuery, since: datetime | None) -> AsyncIterator[Event]:
        # Compared at the stored precision: ``written`` is kept in milliseconds, so an event
        # written in the same millisecond as ``since`` (just after the call) is not missed.
        start = truncate_ms(since if since is not None else await self._now())
        seen = _Seen(self.poll_overlap)
        replay_from: datetime | None = start if since is not None else None
        backoff = 0.1
        while True:
            try:
                # the process's one stream of this event log (or its one poller, where the store
                # has no change streams), filtered for this subscription: drivers/streams.py
                stream = await event_subscription(
                    self.driver,
                    query,
                    clock=self.clock,
                    poll_interval=self.poll_interval,
                    poll_overlap=self.poll_overlap,
                )
            except ResumeTokenLost:
                replay_from = seen.replay_from(start)
                continue
            except StorageError as exc:
                if exc.config:
                    raise
                log.warning("opening the event stream failed (%s); again in %.1fs", exc, backoff)
                await self.clock.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                replay_from = seen.replay_from(start)
                continue
            self.polling = stream.polled
            try:
                if replay_from is not None or stream.polled:
                    # the stream is open: what is stored since is complete (a shared poller may
                    # have handed out events stored since ``start`` before this one joined); what
                    # the replay hands out of the stream's time may come again from the stream
                    seen.keep_from = truncate_ms(self.clock.now()) - self.poll_overlap
                    replay = self._replay(query, replay_from or seen.replay_from(start), seen)
                    async with contextlib.aclosing(replay):
                        async for doc in replay:
                            if doc["written"] >= start:
                                yield self._event(doc)
                    replay_from = None
                async for doc in stream:
                    backoff = 0.1
                    if seen.first(doc):
                        seen.keep_from = None  # past the replay: the overlap is enough again
                        yield self._event(doc)
                return  # the stream ended (closed by the server): a subscription ends with it
            except ResumeTokenLost:
                replay_from = seen.replay_from(start)
            except StorageError as exc:
                if exc.config:
                    raise
                # the shared stream resumes from its own position, but this subscription may have
                # left it meanwhile: read what was stored since the last event it handed out
                replay_from = seen.replay_from(start)
                log.warning("the event stream broke (%s); reopening", exc)
                await self.clock.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                await stream.aclose()

    def _event(self, doc: Mapping[str, Any]) -> Event:
        event = self._recent.get(doc["id"])
        if event is None:
            event = self._recent[doc["id"]] = Event.from_storage(doc)
            if len(self._recent) > RECENT_EVENTS:
                self._recent.popitem(last=False)
        return event

    async def _stored(
        self, query: EventQuery, written_from: datetime
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Stored events with ``written >= written_from`` in (written, id) order, page by page."""
        after: tuple[datetime, str] | None = None
        while True:
            page = await self.driver.list_events(
                EventQuery(
                    keys=query.keys,
                    names=query.names,
                    kinds=query.kinds,
                    plan_ids=query.plan_ids,
                    worker_id=query.worker_id,
                    written_from=written_from,
                    after=after,
                    by_written=True,
                    limit=POLL_PAGE,
                )
            )
            for doc in page:
                yield doc
            if len(page) < POLL_PAGE:
                return
            after = (page[-1]["written"], page[-1]["id"])
            await asyncio.sleep(0)  # a page at a time: others run between (a store that never waits)

    async def _replay(
        self, query: EventQuery, written_from: datetime, seen: _Seen
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Stored events not handed out yet, page by page in stored order; the events of one
        stored instant (a consumer's batch is stored at once) in the order they happened. Holds
        a page and one instant's events (at most ``REPLAY_GROUP_MAX``), whatever the log holds."""
        group: list[dict[str, Any]] = []
        stored = self._stored(query, written_from)
        async with contextlib.aclosing(stored):
            async for doc in stored:
                if group and (doc["written"] != group[0]["written"] or len(group) >= REPLAY_GROUP_MAX):
                    group.sort(key=order_key)
                    for one in group:
                        yield one
                    group = []
                if seen.first(doc):
                    group.append(doc)
        group.sort(key=order_key)
        for one in group:
            yield one


class _Seen:
    """Ids of the events handed out lately and the newest stored time. O(1) per event: ids are
    forgotten oldest first, in the order they were met, once they are older than the overlap
    before the newest — except those stored since ``keep_from`` (the live stream's start, while
    a replay runs: its events may come again from the stream) — and beyond ``cap`` in any case.
    (Two queues and a set: some 50 bytes an id, the id and time being the events' own.)"""

    def __init__(self, overlap: timedelta, cap: int = MAX_SEEN) -> None:
        self.overlap = overlap
        self.cap = cap
        self.ids: set[str] = set()
        self._order: deque[str] = deque()  # the ids, in the order met
        self._written: deque[datetime] = deque()  # their stored times, alike
        self.horizon: datetime | None = None
        self.keep_from: datetime | None = None

    def first(self, doc: Mapping[str, Any]) -> bool:
        """True the first time an event id is met (then remembered, for the overlap)."""
        event_id: str = doc["id"]
        ids = self.ids
        if event_id in ids:
            return False
        written: datetime = doc["written"]
        ids.add(event_id)
        self._order.append(event_id)
        self._written.append(written)
        if self.horizon is None or written > self.horizon:
            self.horizon = written
        low = self.horizon - self.overlap
        if self.keep_from is not None and self.keep_from < low:
            low = self.keep_from
        order, times = self._order, self._written
        while order and (times[0] < low or len(order) > self.cap):  # each id leaves once
            times.popleft()
            ids.discard(order.popleft())
        return True

    def replay_from(self, start: datetime) -> datetime:
        """Where a re-read starts: the overlap before the newest event seen (never before start)."""
        if self.horizon is None:
            return start
        return max(start, self.horizon - self.overlap)


_OUTCOME_KINDS = {
    "succeeded": EventKind.SUCCEEDED,
    "rejected": EventKind.REJECTED,
    "snoozed": EventKind.SNOOZED,
    "released": EventKind.RELEASED,
    "revoked": EventKind.REVOKED,
}


def outcome_kind(outcome: str, fails_for_good: bool) -> EventKind | None:
    """The event of an attempt outcome the store accepted: a failure is ``retried`` while the
    task will run again, ``failed`` when it ends the task."""
    if outcome == "failed":
        return EventKind.FAILED if fails_for_good else EventKind.RETRIED
    return _OUTCOME_KINDS.get(outcome)


def outcome_detail(error: Mapping[str, Any] | None, retry_at: datetime | None) -> dict[str, Any]:
    return {"error": error_detail(error), "retry_at": retry_at}
