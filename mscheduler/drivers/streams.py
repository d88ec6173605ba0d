"""One change stream per process and collection, fanned out to every subscriber.

A server's change stream turns every write of a collection into an event for each stream that
watches it, before that stream's filters run: its cost grows with the streams times the writes.
So a process opens one stream per collection and store, whoever needs it: the consumers'
discovery (``Driver.watch``), the remote executors' waiting leases (``remote/executors.py``), and
the event log's subscriptions (``services/events.py``: the API's server-sent events, the CLI's
``events follow``). Each subscriber states what it wants (a predicate over the items); the hub
hands it those, in the stream's order. Where the store cannot watch, the event log is followed
by one poller per process instead (``list_events`` by stored time), fanned out the same way; the
tasks have no shared poller (each consumer's poll reads its own claim ranges: it is the floor
either way).

``Fanout`` is the mechanism: a source (opened on the first subscription, from the last position
the hub saw, and closed when the last subscriber leaves), a bounded queue per subscriber (one
that falls too far behind is told, as if its stream broke: it polls and subscribes again), and
the source's errors handed to every subscriber as their own stream's would be. The drivers'
``watch`` and ``open_event_stream`` give out subscriptions; the memory driver feeds its hubs
directly (its writes are the events).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Hashable, Sequence
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from mscheduler.domain.clock import Clock
from mscheduler.domain.events import matches
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import (
    ChangeEvent,
    ChangeStreamUnsupported,
    EventQuery,
    ResumeTokenLost,
    StreamPosition,
)

log = logging.getLogger("mscheduler.streams")

T = TypeVar("T")
MAX_QUEUE = 10_000  # items a subscriber may fall behind before it is told to poll and resubscribe
POLL_PAGE = 500


class _End:
    """The source ended (closed or invalidated by the server)."""


_END = _End()


class _Backlog(deque[Any]):
    """A subscription's items not yet taken (``empty`` and ``qsize`` as an ``asyncio.Queue``'s)."""

    def empty(self) -> bool:
        return not self

    def qsize(self) -> int:
        return len(self)


class Subscription(Generic[T]):
    """One subscriber's view of a ``Fanout``: an async iterator of the items it accepts, raising
    what the source raised (``ChangeStreamUnsupported``, ``ResumeTokenLost``, ``StorageError``)
    and ending when it ends. ``resume_token``: the hub's position (after the last item seen).
    ``polled``: the source is a poller, not a change stream."""

    def __init__(self, hub: Fanout[T], admit: Callable[[T], T | None]) -> None:
        self._hub = hub
        self.admit = admit
        # the items not yet taken, and the subscriber waiting for the next one (one reader: a
        # deque and a future cost less per item than an ``asyncio.Queue``)
        self.queue = _Backlog()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    @property
    def resume_token(self) -> Any:
        return self._hub.token

    @property
    def polled(self) -> bool:
        return self._hub.polled

    def put(self, item: Any) -> None:
        if len(self.queue) >= MAX_QUEUE and not isinstance(item, BaseException):
            # fell behind: what it missed is for its poll to find; it resubscribes
            self.queue.clear()
            item = StorageError(
                "fell behind the shared change stream; poll and subscribe again", transient=True
            )
        self.queue.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> Subscription[T]:
        return self

    async def __anext__(self) -> T:
        if self.closed:
            raise StopAsyncIteration
        self._hub.start()
        items = self.queue
        while not items:
            self._waiter = self._hub.loop.create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                # the subscriber's task was cancelled while it waited (a consumer stopping): it
                # is gone, as a cancelled async generator over a stream would close that stream
                await self.aclose()
                raise
            finally:
                self._waiter = None
        item = items.popleft()
        if isinstance(item, _End):
            await self.aclose()
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            await self.aclose()
            raise item
        return item  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Leave the hub; the last subscriber to leave waits until the source is closed (a
        change stream's cursor killed, a poller stopped), as closing a stream of its own would."""
        if not self.closed:
            self.closed = True
            pump = self._hub.leave(self)
            if pump is not None:
                # asyncio.wait: the pump's own cancellation is not raised here (ours still is)
                await asyncio.wait([pump])


class Fanout(Generic[T]):
    """One source, many subscribers (see the module). ``opener(token)`` opens the source from a
    position (None: from now); without one, items are pushed with ``feed`` (the memory driver).
    ``token_of(source, item)``: the position after ``item``."""

    def __init__(
        self,
        key: Hashable,
        opener: Callable[[Any], Awaitable[AsyncIterable[T]]] | None = None,
        token_of: Callable[[Any, T], Any] | None = None,
    ) -> None:
        self.key = key
        self.loop = asyncio.get_running_loop()
        self._opener = opener
        self._token_of = token_of or (lambda source, item: getattr(source, "resume_token", None))
        self.subscribers: list[Subscription[T]] = []
        self.token: Any = None
        self.polled = False
        self.unsupported: ChangeStreamUnsupported | None = None
        self._task: asyncio.Task[None] | None = None
        self.opened = asyncio.Event()  # the source is open (or failed to open: ``open_error``)
        self.open_error: Exception | None = None
        self.sources_opened = 0  # how many times a source was opened (tests and benchmarks count it)

    def subscribe(
        self, admit: Callable[[T], T | None] = lambda item: item, resume_token: Any = None
    ) -> Subscription[T]:
        """A new subscriber: ``admit(item)`` is what it gets of each item (None: nothing).
        ``resume_token``: where to open the source from, if it is not open (a subscriber joining
        an open stream gets what comes next: a shared stream is not rewound)."""
        subscription = Subscription(self, admit)
        self.subscribers.append(subscription)
        if self.unsupported is not None:
            subscription.put(self.unsupported)
        elif resume_token is not None and (self._task is None or self._task.done()):
            self.token = resume_token
        return subscription

    def start(self) -> None:
        """Open the source if it is not (called by a subscriber that waits for an item)."""
        if self._opener is None or self.unsupported is not None:
            return
        if self._task is None or self._task.done():
            self.opened.clear()
            self._task = self.loop.create_task(self._pump(), name=f"mscheduler-stream-{self.key}")

    def feed(self, item: T) -> None:
        """Hand ``item`` to each subscriber, as it admits it."""
        for subscription in list(self.subscribers):
            admitted = subscription.admit(item)
            if admitted is not None:
                subscription.put(admitted)

    def _broadcast(self, item: Any) -> None:
        for subscription in list(self.subscribers):
            subscription.put(item)

    def leave(self, subscription: Subscription[T]) -> asyncio.Task[None] | None:
        """Remove a subscriber; the last one stops the source. Returns the source's task when
        it was stopped (it closes the source in its ``finally``: await it to know it is closed)."""
        if subscription in self.subscribers:
            self.subscribers.remove(subscription)
        stopped = None
        if not self.subscribers:
            if self._task is not None and not self._task.done():
                self._task.cancel()  # its source closes (the iterator's finally)
                stopped = self._task
            self._task = None
            _forget(self)
        return stopped

    async def _pump(self) -> None:
        assert self._opener is not None
        self.open_error = None
        try:
            source = await self._opener(self.token)
        except ChangeStreamUnsupported as exc:
            self.unsupported = self.open_error = exc
            self.opened.set()
            self._broadcast(exc)
            return
        except Exception as exc:
            if isinstance(exc, ResumeTokenLost):
                self.token = None
            self.open_error = exc
            self.opened.set()
            self._broadcast(exc)
            return
        self.sources_opened += 1
        self.opened.set()
        try:
            async for item in source:
                self.token = self._token_of(source, item)
                self.feed(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, ResumeTokenLost):
                self.token = None
            self._broadcast(exc)
            return
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception as exc:  # closing a broken stream: nothing to do about it
                    log.debug("closing a change stream failed: %r", exc)
        self.token = None  # closed or invalidated: the next one starts afresh
        self._broadcast(_END)


def wanted_by(names: Sequence[str]) -> Callable[[Any], Any]:
    """A subscriber's view of a shared task stream: changes of tasks with these names, changes
    that do not say their name (a stop request of the Mongo stream: the consumer running one of
    its attempts acts on it), and stream positions; another name's change is a position to it
    (the stream moved on: what it resumes from)."""
    wanted = frozenset(names)

    def admit(item: Any) -> Any:
        if not isinstance(item, ChangeEvent) or not item.name or item.name in wanted:
            return item
        return StreamPosition(item.token) if item.token is not None else None

    return admit


_HUBS: dict[tuple[int, Hashable], Fanout[Any]] = {}


def shared(
    key: Hashable,
    opener: Callable[[Any], Awaitable[AsyncIterable[Any]]] | None = None,
    token_of: Callable[[Any, Any], Any] | None = None,
) -> Fanout[Any]:
    """The process's hub for ``key`` (a collection of a store) on the running event loop."""
    loop = asyncio.get_running_loop()
    hub = _HUBS.get((id(loop), key))
    if hub is None or hub.loop is not loop:
        hub = _HUBS[(id(loop), key)] = Fanout(key, opener, token_of)
    return hub


def subscriptions(driver: Any, collection: str) -> int:
    """How many subscriptions this process holds on ``driver``'s ``collection`` (``"tasks"`` or
    ``"events"``) on the running event loop: what the API's caps count (one source serves them)."""
    loop = asyncio.get_running_loop()
    prefix = "tasks" if collection == "tasks" else "events"
    hub = _HUBS.get((id(loop), (prefix, stream_key(driver, collection))))
    return len(hub.subscribers) if hub is not None else 0


def _forget(hub: Fanout[Any]) -> None:
    """A hub without subscribers leaves the registry (a later one opens afresh), unless it
    remembers that the store cannot watch (asked once per process)."""
    if hub.unsupported is None and _HUBS.get((id(hub.loop), hub.key)) is hub and hub._opener is not None:
        del _HUBS[(id(hub.loop), hub.key)]


# -- the event log: one change stream, or one poller, per process ----------------------------------


class EventPoller:
    """The event log followed by reading it (a store without change streams): every
    ``interval`` seconds, the events stored since the newest seen minus ``overlap`` (an insert
    in flight while the last read ran is not missed), each id handed out once, in time order."""

    def __init__(
        self, list_events: Any, clock: Clock, interval: float, overlap: timedelta, start: datetime
    ) -> None:
        self._list = list_events
        self.clock = clock
        self.interval = interval
        self.overlap = overlap
        self.horizon = start
        self.seen: dict[str, datetime] = {}
        self.resume_token: Any = None

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            low = self.horizon - self.overlap
            found: list[dict[str, Any]] = []
            try:
                after: tuple[datetime, str] | None = None
                while True:
                    query = EventQuery(written_from=low, after=after, by_written=True, limit=POLL_PAGE)
                    page = await self._list(query)
                    found += [doc for doc in page if doc["id"] not in self.seen]
                    if len(page) < POLL_PAGE:
                        break
                    after = (page[-1]["written"], page[-1]["id"])
                    await asyncio.sleep(0)  # a page at a time: others run between (a store that never waits)
            except StorageError as exc:
                if exc.config:
                    raise
                log.warning("reading events failed (%s); trying again", exc)
            found.sort(key=lambda d: (d["time"], d.get("step", 0), d["id"]))
            for doc in found:
                self.seen[doc["id"]] = doc["written"]
                self.horizon = max(self.horizon, doc["written"])
                yield doc
            if len(self.seen) > 1000:
                self.seen = {i: w for i, w in self.seen.items() if w >= low}
            await self.clock.sleep(self.interval)


async def event_subscription(
    driver: Any,
    query: EventQuery,
    *,
    clock: Clock,
    poll_interval: float,
    poll_overlap: timedelta,
) -> Subscription[dict[str, Any]]:
    """A subscription to the event log's stored events that match ``query``, from the process's
    one source for this store's event log: its change stream, or (where there is none) its
    poller. Returns once the source is open; raises what opening it raised
    (``ResumeTokenLost``, ``StorageError``)."""

    async def opener(token: Any) -> AsyncIterable[dict[str, Any]]:
        hub.polled = False
        try:
            stream: AsyncIterable[dict[str, Any]] = await driver.open_event_stream(EventQuery(), token)
        except ChangeStreamUnsupported:
            hub.polled = True
            return EventPoller(driver.list_events, clock, poll_interval, poll_overlap, clock.now())
        return stream

    hub = shared(("events", stream_key(driver, "events")), opener)
    subscription = hub.subscribe(lambda doc: doc if matches(doc, query) else None)
    hub.start()
    try:
        await hub.opened.wait()
    except BaseException:  # cancelled while it opened (a client that went away): not left behind
        await asyncio.shield(subscription.aclose())
        raise
    if hub.open_error is not None:
        await subscription.aclose()
        raise hub.open_error
    return subscription


def stream_key(driver: Any, collection: str) -> Hashable:
    """What identifies a driver's collection in this process (two driver objects over the same
    collection share its stream): the driver's own ``stream_key``, else the object."""
    key = getattr(driver, "stream_key", None)
    return key(collection) if callable(key) else (collection, id(driver))
