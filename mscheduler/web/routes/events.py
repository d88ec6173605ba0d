"""The event log over HTTP: ``GET /api/v1/events`` lists recorded events,
``GET /api/v1/events/stream`` follows new ones as server-sent events.

Both read ``mscheduler.services.events.Events`` over the app's store and take the same filters (a task
key, a task name, event kinds, a plan); nothing here queries the store itself. The event log is a
switch of the store (``MongoDriver(db, events=True)``): with it off both answer 409
``event_log_off`` rather than an empty list that would look like "nothing happened".

The stream sends each event as ``id: <stored time>/<event id>``, ``event: <kind>``, ``data:
<the event as JSON>``, and a comment line every ``HEARTBEAT_SECONDS`` while nothing happens (so a
dead connection is noticed). A client that reconnects with ``Last-Event-ID`` (browsers'
``EventSource`` do) goes on after the last event it had; ``since`` starts from a stored time. The
subscription is closed as soon as the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote, unquote

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.services.events import LIST_LIMIT_MAX, Event, Events
from mscheduler.web.auth import Role
from mscheduler.web.deps import ERROR_ANSWERS, HttpError, IsoTime, Ops, Who, bearer, known_query
from mscheduler.web.guards import Slots
from mscheduler.web.models import ErrorOut

HEARTBEAT_SECONDS = 15.0
EVENT_LOG_OFF = "the event log is off: turn it on in the store (MongoDriver(db, events=True))"
LAST_EVENT_ID_MAX = 2000
SSE_BATCH = 200  # events sent in one write at most (those waiting when the stream writes)


class EventPageOut(BaseModel):
    events: list[Event]
    next_skip: int | None  # pass as ``skip`` (same filters) for the next page; None: no more


_OFF: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "the store's event log is off (error: event_log_off)"}
}

events = APIRouter(
    prefix="/events",
    tags=["events"],
    dependencies=[Depends(bearer), Depends(known_query)],
    responses=ERROR_ANSWERS,
)


def event_log(request: Request, operations: Ops) -> Events:
    """The app's ``Events`` reader (one per app, made on first use); 409 when the log is off."""
    if not getattr(operations.driver, "record_events", False):
        raise HttpError(409, "event_log_off", EVENT_LOG_OFF)
    reader: Events | None = getattr(request.app.state, "events", None)
    if reader is None or reader.driver is not operations.driver:
        limits = request.app.state.limits
        reader = Events(operations.driver, clock=operations.clock, max_replay=limits.replay_seconds)
        request.app.state.events = reader
    return reader


def sse_texts(request: Request) -> SseTexts:
    texts: SseTexts | None = getattr(request.app.state, "sse_texts", None)
    if texts is None:
        texts = request.app.state.sse_texts = SseTexts()
    return texts


Log = Annotated[Events, Depends(event_log)]
KeyQ = Annotated[str | None, Query(description="one task's events")]
NameQ = Annotated[str | None, Query(description="events of tasks with this name")]
KindsQ = Annotated[
    str | None, Query(max_length=1000, description="comma-separated kinds, e.g. succeeded,failed")
]
PlanQ = Annotated[str | None, Query(description="events of this plan's run tasks")]


def _kinds(value: str | None) -> list[str] | None:
    if value is None:
        return None
    kinds = [part.strip() for part in value.split(",") if part.strip()]
    if not kinds:
        raise InvalidInput("kinds: give at least one event kind")
    return kinds


@events.get("", response_model=EventPageOut, responses=_OFF, summary="Recorded events, in time order")
async def list_events(
    log: Log,
    who: Who,
    key: KeyQ = None,
    name: NameQ = None,
    kinds: KindsQ = None,
    plan: PlanQ = None,
    worker_id: Annotated[str | None, Query(description="events of this worker's attempts")] = None,
    since: Annotated[IsoTime | None, Query(description="at or after this time (with offset)")] = None,
    until: Annotated[IsoTime | None, Query(description="before this time (with offset)")] = None,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX)] = 100,
    skip: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> EventPageOut:
    """Events with ``since <= time < until``, filtered, oldest first; ``next_skip`` pages on.
    A read token gets opaque event ids (an attempt's event id holds its attempt token)."""
    found = await log.list(
        keys=key,
        names=name,
        kinds=_kinds(kinds),
        plans=plan,
        worker_id=worker_id,
        since=since,
        until=until,
        limit=limit,
        skip=skip,
    )
    shown = [public_event(e) for e in found] if who.role is not Role.ADMIN else found
    return EventPageOut(events=shown, next_skip=skip + len(found) if len(found) == limit else None)


def public_event(event: Event) -> Event:
    """The event with an opaque id: the stored id of an attempt's event holds the attempt's
    token (``key|attempt|kind``), which only admin tokens may see. Deterministic, so a stream's
    ``Last-Event-ID`` and a listing name an event alike."""
    return event.model_copy(update={"id": public_id(event.id)})


def public_id(event_id: str) -> str:
    return "e" + hashlib.sha256(event_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def sse_id(event: Event) -> str:
    """The stream's id of an event: its stored time and its id (percent-encoded: one line)."""
    written = event.written or event.time
    return f"{written.isoformat()}/{quote(event.id, safe='')}"


def parse_sse_id(value: str) -> tuple[datetime, str]:
    """The stored time and event id of a ``Last-Event-ID`` this stream sent."""
    when, sep, event_id = value.partition("/")
    try:
        parsed = datetime.fromisoformat(when)
    except ValueError:
        parsed = None
    if not sep or parsed is None or parsed.tzinfo is None or len(value) > LAST_EVENT_ID_MAX:
        raise InvalidInput("Last-Event-ID: not an id this stream sent (<stored time>/<event id>)")
    return parsed, unquote(event_id)


def sse_message(event: Event) -> str:
    return f"id: {sse_id(event)}\nevent: {event.kind.value}\ndata: {event.model_dump_json()}\n\n"


class SseTexts:
    """The stream text of the events sent lately, by (event id, shown to a read token): every
    stream of the app sends an event, so it is encoded once, not once per stream."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._texts: OrderedDict[tuple[str, bool], str] = OrderedDict()

    def of(self, event: Event, public: bool) -> tuple[str, str]:
        """The event's text and the id the client sees (opaque for a read token)."""
        key = (event.id, public)
        text = self._texts.get(key)
        if text is None:
            shown = public_event(event) if public else event
            text = self._texts[key] = sse_message(shown)
            if len(self._texts) > self.size:
                self._texts.popitem(last=False)
        return text, (public_id(event.id) if public else event.id)


async def _pump(source: AsyncIterator[Event], queue: asyncio.Queue[Event | BaseException]) -> None:
    """Move the subscription's events to the queue (the response waits on it with a timeout)."""
    try:
        async for event in source:
            await queue.put(event)
    except Exception as exc:  # handed to the response, which ends the stream
        await queue.put(exc)


async def _sse(
    source: AsyncIterator[Event],
    skip_id: str | None,
    max_events: int | None,
    texts: SseTexts,
    *,
    public: bool = False,
) -> AsyncIterator[str]:
    """The stream's text: the events waiting are sent together, in one write (at most
    ``SSE_BATCH``): a replay or a burst costs a write per batch, not per event."""
    queue: asyncio.Queue[Event | BaseException] = asyncio.Queue(maxsize=SSE_BATCH)
    pump = asyncio.create_task(_pump(source, queue))
    sent = 0
    try:
        yield ": mscheduler events\n\n"  # the headers and a first byte: the client knows it is open
        while max_events is None or sent < max_events:
            # asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for swallows a
            # cancellation that comes when its inner wait is done already — which, while events
            # keep coming, is always: a client that went away was then streamed to for ever
            try:
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    item = await queue.get()
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            parts: list[str] = []
            while True:
                if isinstance(item, BaseException):
                    parts.append(f"event: error\ndata: {json.dumps({'error': type(item).__name__})}\n\n")
                    yield "".join(parts)
                    return
                text, shown_id = texts.of(item, public)
                if skip_id is None or shown_id != skip_id:  # the client's Last-Event-ID: it has this one
                    parts.append(text)
                    sent += 1
                if queue.empty() or (max_events is not None and sent >= max_events):
                    break
                item = queue.get_nowait()
            if parts:
                yield "".join(parts)
    finally:  # the client went away (the response is cancelled) or the stream ended
        pump.cancel()
        # the subscription is closed whatever happens here: the response's cancellation is
        # delivered again at each of our awaits, so the closing runs as its own task
        closing = asyncio.ensure_future(_close(pump, source))
        _CLOSING.add(closing)
        closing.add_done_callback(_CLOSING.discard)
        await asyncio.shield(closing)


_CLOSING: set[asyncio.Future[None]] = set()  # subscriptions being closed (kept from the GC)


async def _close(pump: asyncio.Task[None], source: AsyncIterator[Event]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await pump
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


@events.get(
    "/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "server-sent events: one per recorded event (event: its kind)",
        },
        **_OFF,
    },
    summary="Follow new events (server-sent events)",
)
async def stream_events(
    log: Log,
    request: Request,
    who: Who,
    key: KeyQ = None,
    name: NameQ = None,
    kinds: KindsQ = None,
    plan: PlanQ = None,
    since: Annotated[
        IsoTime | None,
        Query(description="replay events stored since (with offset; at most ApiLimits.replay_seconds back)"),
    ] = None,
    max_events: Annotated[int | None, Query(ge=1, le=10**6, description="end after this many")] = None,
    last_event_id: Annotated[str | None, Header(description="resume after this event")] = None,
) -> StreamingResponse:
    """New events as they are stored (a change stream where the store has one, else polling);
    from ``since`` or after ``Last-Event-ID`` if given. Ends after ``max_events`` if given. One
    token may hold ``ApiLimits.streams_per_token`` streams at once, all tokens
    ``streams_total``: one more is a 429 ``too_many_streams`` with ``Retry-After``."""
    skip_id = None
    if last_event_id is not None:
        since, skip_id = parse_sse_id(last_event_id)
    wanted = _kinds(kinds)
    streams: Slots = request.app.state.streams
    refusal = streams.acquire(who.name)
    if refusal is not None:
        retry = str(request.app.state.limits.retry_after_seconds)
        raise HttpError(429, "too_many_streams", refusal, headers={"Retry-After": retry})
    release = _once(lambda: streams.release(who.name))
    try:
        source = log.subscribe(keys=key, names=name, kinds=wanted, plans=plan, since=since)
        return _HeldStream(
            _sse(source, skip_id, max_events, sse_texts(request), public=who.role is not Role.ADMIN),
            release,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
    except BaseException:
        release()
        raise


class _HeldStream(StreamingResponse):
    """A stream that gives its slot back when it ends, however it ends (the client went away,
    the server stops, ``max_events`` were sent)."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def _once(action: Callable[[], None]) -> Callable[[], None]:
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            action()

    return run
