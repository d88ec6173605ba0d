"""The memory driver's event log: the newest ``max_events`` events in insertion order, and
in-process streams (the memory driver's change stream).

Bounded by a cap, not by time (the Mongo driver's TTL index): when full, the oldest stored
event is dropped. A stream's resume token is the sequence number of the last event it handed
out; reopening from a token the cap has dropped raises ``ResumeTokenLost``. As in the rest of
``MemoryDriver``, no operation awaits inside, so each is atomic on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from mscheduler.domain.events import DEFAULT_MAX_EVENTS, EventWriter, matches, order_key
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.drivers.base import EventQuery, EventStream, InsertEventsParams, ResumeTokenLost


def _copy(doc: Mapping[str, Any]) -> dict[str, Any]:
    return dict(doc) | {"detail": dict(doc["detail"])}


class _MemoryEventStream:
    """Events stored after it opened (or after ``resume_token``) that match its query."""

    def __init__(self, owner: MemoryEvents, query: EventQuery, token: int) -> None:
        self._owner = owner
        self.query = query
        self.resume_token: Any = token
        self.queue: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            seq, doc = await self.queue.get()
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
    _events: OrderedDict[str, tuple[int, dict[str, Any]]]
    _event_streams: list[_MemoryEventStream]

    def _init_events(self, record: bool, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        if not isinstance(max_events, int) or max_events < 1:
            raise InvalidInput("max_events must be a positive integer")
        self.record_events = record
        self.event_writer = EventWriter()  # the events this store's own writes cause
        self.max_events = max_events
        self._events = OrderedDict()
        self._event_seq = itertools.count(1)
        self._event_streams = []
        self.events_dropped = 0  # dropped by the cap

    def _store_events(self, docs: Sequence[Mapping[str, Any]], now: datetime) -> int:
        """Store events now (no await: atomic with the write that caused them)."""
        stored = 0
        for event in docs:
            if event["id"] in self._events:
                continue  # the same event again (a retry, or another worker's pass): kept once
            doc = dict(event)  # ``detail`` is shared: stored events are never changed in place
            doc["written"] = now
            seq = next(self._event_seq)
            self._events[doc["id"]] = (seq, doc)
            stored += 1
            if len(self._events) > self.max_events:
                self._events.popitem(last=False)
                self.events_dropped += 1
            for stream in self._event_streams:
                if matches(doc, stream.query):
                    stream.queue.put_nowait((seq, _copy(doc)))
        return stored

    def _record(self, docs: Sequence[Mapping[str, Any]], now: datetime) -> None:
        if self.record_events and docs:
            self._store_events(docs, now)

    async def insert_events(self, params: InsertEventsParams) -> int:
        if params.session is not None:
            raise InvalidInput("the memory driver has no sessions or transactions")
        return self._store_events(params.events, params.now)

    async def list_events(self, query: EventQuery) -> list[dict[str, Any]]:
        found = [doc for _, doc in self._events.values() if matches(doc, query)]
        if query.by_written:
            found.sort(key=lambda d: (d["written"], d["id"]))
        else:
            found.sort(key=order_key)
        return [_copy(d) for d in found[query.skip : query.skip + query.limit]]

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
            for seq, doc in self._events.values():
                if seq > resume_token and matches(doc, query):
                    stream.queue.put_nowait((seq, _copy(doc)))
        self._event_streams.append(stream)
        return stream
