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
import builtins
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
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
POLL_PAGE = 500


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
        """Write what is buffered in one insert. False if the store did not take it (a transient
        error: the events are kept for the next try); configuration errors are raised."""
        if not self._buffer:
            return True
        batch = list(self._buffer)
        self._buffer.clear()
        self._full.clear()
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
        self.flushes += 1
        self._warned = False
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
    """

    def __init__(
        self,
        driver: Driver,
        *,
        clock: Clock | None = None,
        poll_interval: float = 1.0,
        poll_overlap: float = 30.0,
    ) -> None:
        if not 0 < poll_interval <= 3600 or not 0 <= poll_overlap <= 3600:
            raise InvalidInput("poll_interval must be in (0, 3600] and poll_overlap in [0, 3600] seconds")
        self.driver = driver
        self.clock = clock if isinstance(clock, ServerClock) else ServerClock(clock)
        self.poll_interval = poll_interval
        self.poll_overlap = timedelta(seconds=poll_overlap)
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

        From now, or from events stored since ``since``. Each event once, none left out while it
        is within the retention: on a change stream (resumed after errors), else polling by
        stored time (``poll_interval``, re-reading ``poll_overlap``).
        """
        query = self._query(keys, names, kinds, plans)
        return self._subscribe(query, _time(since, "since"))

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
                    # have handed out events stored since ``start`` before this one joined)
                    for doc in await self._unseen(query, replay_from or seen.replay_from(start), seen):
                        if doc["written"] >= start:
                            yield Event.from_storage(doc)
                    replay_from = None
                async for doc in stream:
                    backoff = 0.1
                    if seen.first(doc):
                        yield Event.from_storage(doc)
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

    async def _stored(self, query: EventQuery, written_from: datetime) -> AsyncIterator[dict[str, Any]]:
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

    async def _unseen(
        self, query: EventQuery, written_from: datetime, seen: _Seen
    ) -> builtins.list[dict[str, Any]]:
        """Stored events not handed out yet, in time order (a consumer's batch is stored at once;
        this tells its events in the order they happened)."""
        found = [doc async for doc in self._stored(query, written_from) if seen.first(doc)]
        found.sort(key=order_key)
        return found


class _Seen:
    """Ids of the events handed out lately (within the overlap), and the newest stored time."""

    def __init__(self, overlap: timedelta) -> None:
        self.overlap = overlap
        self.ids: dict[str, datetime] = {}
        self.horizon: datetime | None = None

    def first(self, doc: Mapping[str, Any]) -> bool:
        """True the first time an event id is met (then remembered, for the overlap)."""
        if doc["id"] in self.ids:
            return False
        written: datetime = doc["written"]
        self.ids[doc["id"]] = written
        if self.horizon is None or written > self.horizon:
            self.horizon = written
        if len(self.ids) > 2000:
            self.prune(self.horizon - self.overlap)
        return True

    def replay_from(self, start: datetime) -> datetime:
        """Where a re-read starts: the overlap before the newest event seen (never before start)."""
        if self.horizon is None:
            return start
        return max(start, self.horizon - self.overlap)

    def prune(self, low: datetime) -> None:
        if len(self.ids) > 1000:
            self.ids = {i: w for i, w in self.ids.items() if w >= low}


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
