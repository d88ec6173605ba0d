"""The memory driver's event log: the newest ``max_events`` events in insertion order, and
in-process streams (the memory driver's change stream).

Bounded by a cap, not by time (the Mongo driver's TTL index): when full, the oldest stored
event is dropped. Stored events are packed into tuples of plain values (``pack_event``), not
dictionaries: a tuple that holds no container is left alone by Python's cyclic garbage
collector, so the newest 100,000 events add nothing to the full collections whose pauses stall
the event loop (dictionaries stay tracked for good; at 1,500 tasks a second the log's dictionaries
made most of a full collection's work). They are unpacked when read. A stream's resume token
is the sequence number of the last event it handed out; reopening from a token the cap has
dropped raises ``ResumeTokenLost``. As in the rest of ``MemoryDriver``, no operation awaits
inside, so each is atomic on the event loop.

Two indexes keep a read from scanning the whole log, as the Mongo driver's indexes do: the
events in ``(written, id)`` order (a poller's or a replay's page starts where the last one ended:
a bisection, then only the page is read) and each task key's events (a task's history).
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from mscheduler.domain.events import DEFAULT_MAX_EVENTS, EventWriter, matches, order_key
from mscheduler.domain.exceptions import InvalidInput, StorageError
from mscheduler.drivers.base import EventQuery, EventStream, InsertEventsParams, ResumeTokenLost


def _copy(doc: Mapping[str, Any]) -> dict[str, Any]:
    return dict(doc) | {"detail": dict(doc["detail"])}


# the fields every event has or may have (mscheduler.domain.events.event_doc), at fixed places of
# a packed event; then its detail's items and any other fields', as tuples of pairs
_FIELDS = (
    "id",
    "kind",
    "key",
    "name",
    "plan_id",
    "worker_id",
    "attempt",
    "step",
    "writer",
    "seq",
    "time",
    "written",
)
_AT = {name: i for i, name in enumerate(_FIELDS)}
_DETAIL, _EXTRA = len(_FIELDS), len(_FIELDS) + 1
_MISSING: Any = object()  # a field the event does not have (an object() holds no reference: untracked)
Packed = tuple[Any, ...]


def pack_event(doc: Mapping[str, Any]) -> Packed:
    """A stored event as a tuple (see the module); ``unpack_event`` gives the document back."""
    detail = doc.get("detail")
    extra = tuple((k, v) for k, v in doc.items() if k not in _AT and k != "detail")
    return (*(doc.get(name, _MISSING) for name in _FIELDS), tuple(detail.items()) if detail else (), extra)


def unpack_event(packed: Packed) -> dict[str, Any]:
    doc = {name: value for name, value in zip(_FIELDS, packed, strict=False) if value is not _MISSING}
    doc["detail"] = dict(packed[_DETAIL])
    doc.update(packed[_EXTRA])
    return doc


class _Fields(Mapping[str, Any]):
    """A packed event's fixed fields, read in place (what ``matches`` and ``order_key`` read)."""

    __slots__ = ("packed",)

    def __init__(self, packed: Packed) -> None:
        self.packed = packed

    def __getitem__(self, name: str) -> Any:
        at = _AT.get(name)
        value = _MISSING if at is None else self.packed[at]
        if value is _MISSING:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (name for name, value in zip(_FIELDS, self.packed, strict=False) if value is not _MISSING)

    def __len__(self) -> int:
        return sum(1 for _ in self)


MAX_STREAM_BACKLOG = 10_000  # events a stream's reader may fall behind before the stream breaks


class _MemoryEventStream:
    """Events stored after it opened (or after ``resume_token``) that match its query. A reader
    that falls ``MAX_STREAM_BACKLOG`` events behind gets a transient ``StorageError`` instead
    of a queue that grows with the traffic (it reopens from its token, as after a broken
    change stream)."""

    def __init__(self, owner: MemoryEvents, query: EventQuery, token: int) -> None:
        self._owner = owner
        self.query = query
        self.resume_token: Any = token
        self.queue: asyncio.Queue[tuple[int, dict[str, Any] | None]] = asyncio.Queue()
        self.behind = False

    def put(self, seq: int, doc: dict[str, Any]) -> None:
        if self.behind:
            return
        if self.queue.qsize() >= MAX_STREAM_BACKLOG:
            self.behind = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait((seq, None))
            return
        self.queue.put_nowait((seq, doc))

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            seq, doc = await self.queue.get()
            if doc is None:
                raise StorageError("fell behind the event log's stream; reopen it", transient=True)
            self.resume_token = seq
            yield doc

    async def aclose(self) -> None:
        if self in self._owner._event_streams:
            self._owner._event_streams.remove(self)


class MemoryEvents:
    """Event operations of ``MemoryDriver`` (a mixin)."""

    record_events: bool
    event_writer: EventWriter
    max_events: int
    _events: OrderedDict[str, tuple[int, Packed]]
    _event_streams: list[_MemoryEventStream]
    # (written, id) of every stored event, sorted, from ``_by_written_start`` on (the entries
    # before it were dropped by the cap; cut off now and then)
    _by_written: list[tuple[datetime, str]]
    _by_written_start: int
    _event_ids_of_key: dict[str, deque[str]]  # each key's event ids, in insertion order

    def _init_events(self, record: bool, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        if not isinstance(max_events, int) or max_events < 1:
            raise InvalidInput("max_events must be a positive integer")
        self.record_events = record
        self.event_writer = EventWriter()  # the events this store's own writes cause
        self.max_events = max_events
        self._events = OrderedDict()
        self._event_seq = itertools.count(1)
        self._event_streams = []
        self._by_written = []
        self._by_written_start = 0
        self._event_ids_of_key = {}
        self.events_dropped = 0  # dropped by the cap

    def _index_event(self, doc: dict[str, Any]) -> None:
        position = (doc["written"], doc["id"])
        order = self._by_written
        if not order or order[-1] < position:
            order.append(position)  # the usual case: stored after every other one
        else:
            bisect.insort(order, position, lo=self._by_written_start)
        self._event_ids_of_key.setdefault(doc["key"], deque()).append(doc["id"])

    def _drop_oldest_event(self) -> None:
        """Drop the oldest stored event (the cap) from the log and its indexes."""
        event_id, (_, packed) = self._events.popitem(last=False)
        doc = _Fields(packed)
        self.events_dropped += 1
        ids = self._event_ids_of_key[doc["key"]]
        ids.popleft()  # the key's oldest: the log's oldest is every key's oldest
        if not ids:
            del self._event_ids_of_key[doc["key"]]
        order, start = self._by_written, self._by_written_start
        position = (doc["written"], event_id)
        if order[start] == position:
            self._by_written_start = start = start + 1
            if start > 4096 and start * 2 > len(order):
                del order[:start]
                self._by_written_start = 0
        else:  # stored out of written order (a writer's clock behind another's): rare
            del order[bisect.bisect_left(order, position, lo=start)]

    def restore_events(self, docs: Sequence[dict[str, Any]]) -> None:
        """Put stored events (a snapshot's, with their ``written``) into an empty log."""
        for doc in docs:
            self._events[doc["id"]] = (next(self._event_seq), pack_event(doc))
            self._index_event(doc)
            if len(self._events) > self.max_events:
                self._drop_oldest_event()

    def _store_events(self, docs: Sequence[Mapping[str, Any]], now: datetime) -> int:
        """Store events now (no await: atomic with the write that caused them)."""
        stored = 0
        for event in docs:
            if event["id"] in self._events:
                continue  # the same event again (a retry, or another worker's pass): kept once
            doc = dict(event)  # ``detail`` is shared: stored events are never changed in place
            doc["written"] = now
            seq = next(self._event_seq)
            self._events[doc["id"]] = (seq, pack_event(doc))
            self._index_event(doc)
            stored += 1
            if len(self._events) > self.max_events:
                self._drop_oldest_event()
            for stream in self._event_streams:
                if matches(doc, stream.query):
                    stream.put(seq, _copy(doc))
        return stored

    def _record(self, docs: Sequence[Mapping[str, Any]], now: datetime) -> None:
        if self.record_events and docs:
            self._store_events(docs, now)

    async def insert_events(self, params: InsertEventsParams) -> int:
        if params.session is not None:
            raise InvalidInput("the memory driver has no sessions or transactions")
        return self._store_events(params.events, params.now)

    def stored_events(self) -> Iterator[dict[str, Any]]:
        """Every stored event, oldest first (new documents: a snapshot's)."""
        return (unpack_event(packed) for _, packed in self._events.values())

    async def list_events(self, query: EventQuery) -> list[dict[str, Any]]:
        if query.by_written:
            return self._by_written_page(query)
        wanted = query.skip + query.limit
        if query.keys:  # a task's history: its own events only
            ids = (i for key in query.keys for i in self._event_ids_of_key.get(key, ()))
            candidates = (self._events[i][1] for i in ids)
        else:
            candidates = (packed for _, packed in self._events.values())
        found = heapq.nsmallest(
            wanted,
            (fields for packed in candidates if matches(fields := _Fields(packed), query)),
            key=order_key,
        )
        return [unpack_event(d.packed) for d in found[query.skip :]]

    def _by_written_page(self, query: EventQuery) -> list[dict[str, Any]]:
        """One page in ``(written, id)`` order from the index: a bisection to where the page
        starts (``after``, ``written_from``), then the events from there until the page is full."""
        order, low = self._by_written, self._by_written_start
        if query.after is not None:
            low = bisect.bisect_right(order, tuple(query.after), lo=low)
        if query.written_from is not None:
            low = max(low, bisect.bisect_left(order, (query.written_from,), lo=low))
        skip, found = query.skip, []
        for i in range(low, len(order)):
            packed = self._events[order[i][1]][1]
            if not matches(_Fields(packed), query):
                continue
            if skip:
                skip -= 1
                continue
            found.append(unpack_event(packed))
            if len(found) >= query.limit:
                break
        return found

    async def open_event_stream(self, query: EventQuery, resume_token: Any = None) -> EventStream:
        last = next(reversed(self._events.values()))[0] if self._events else 0
        stream = _MemoryEventStream(self, query, last)
        if resume_token is not None:
            if not isinstance(resume_token, int):
                raise ResumeTokenLost(f"not a memory stream token: {resume_token!r}")
            oldest = next(iter(self._events.values()))[0] if self._events else last + 1
            if resume_token < oldest - 1:
                raise ResumeTokenLost("events after this token were dropped by the cap")
            stream.resume_token = resume_token
            for seq, packed in self._events.values():
                if seq > resume_token and matches(_Fields(packed), query):
                    stream.put(seq, unpack_event(packed))
        self._event_streams.append(stream)
        return stream
