"""Tools for consumer-level tests: a harness over one store, wrapper drivers that misbehave on cue.

Time only moves when a test advances the ``FakeClock``; the tests wait for consumer events
(``Recorder``) and let ready tasks run (``settle``), they never sleep until a lease expires.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, Publisher, TaskInfo
from mscheduler.drivers.base import ChangeEvent, ChangeStreamUnsupported, Driver, event_for
from tests.helpers import Recorder

STOP_TIMEOUT = 10.0


# A real server answers over the network: give its replies time to arrive as well.
REAL_IO_DELAY = 0.05 if os.environ.get("MSCHEDULER_TEST_MONGODB_URI") else 0.0


async def settle(rounds: int = 50) -> None:
    """Let every task that is ready run, without moving any clock.

    The memory driver and mongomock never really wait, so a bounded number of loop turns is
    enough for the consumers to react to what the test just did.
    """
    for _ in range(rounds):
        await asyncio.sleep(0)
    if REAL_IO_DELAY:
        await asyncio.sleep(REAL_IO_DELAY)
        for _ in range(rounds):
            await asyncio.sleep(0)


class Gate:
    """A handler blocks on ``wait()`` until the test opens the gate; counts who is waiting."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self.waiting = 0

    def open(self) -> None:
        self._open.set()

    async def wait(self) -> None:
        self.waiting += 1
        try:
            await self._open.wait()
        finally:
            self.waiting -= 1


class Harness:
    """One store (via ``make_driver``), a publisher, consumers on the fake clock, one recorder."""

    def __init__(self, make_driver: Callable[[FakeClock | None], Driver], clock: FakeClock) -> None:
        self.make_driver = make_driver
        self.clock = clock
        self.driver = make_driver(clock)
        self.publisher = Publisher(self.driver, clock=clock)
        self.recorder = Recorder()
        self.consumers: list[Consumer] = []

    def new_driver(self) -> Driver:
        """Another connection to the same store (the memory driver is shared as is)."""
        return self.make_driver(self.clock)

    def consumer(
        self,
        worker_id: str,
        handlers: dict[str, Callable[..., Any]],
        *,
        driver: Driver | None = None,
        **kwargs: Any,
    ) -> Consumer:
        kwargs.setdefault("poll_interval", 1.0)
        kwargs.setdefault("concurrency", 1)
        consumer = Consumer(driver or self.new_driver(), worker_id=worker_id, clock=self.clock, **kwargs)
        for name, fn in handlers.items():
            consumer.register(name, fn)
        self.recorder.attach(consumer)
        self.consumers.append(consumer)
        return consumer

    async def start(self, *consumers: Consumer) -> None:
        for consumer in consumers:
            await consumer.start()
        await settle()

    async def discover(self, *consumers: Consumer) -> None:
        """Make each consumer poll now (the floor), as its poll timer would, then let it claim."""
        for consumer in consumers or tuple(self.consumers):
            if consumer.discovery is not None and not consumer._stopping:
                await consumer.discovery.poll_once()
        await settle()

    async def advance(self, seconds: float) -> None:
        """Move the fake clock, then let everything that woke up run."""
        await settle()
        self.clock.advance(timedelta(seconds=seconds))
        await settle()

    async def get(self, key: str) -> TaskInfo:
        return await self.publisher.get(key)

    def claims(self, key: str | None = None) -> list[str]:
        """Worker ids of every claim so far (of one task, if ``key`` is given), in order."""
        return [w for w, d in self.recorder.of("claimed") if key is None or d["key"] == key]

    def finished(self, outcome: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        return [(w, d) for w, d in self.recorder.of("finished") if outcome is None or d["outcome"] == outcome]

    async def close(self) -> None:
        """Stop every consumer; one that does not stop in time fails the test, torn down by force."""
        stuck = []
        for consumer in self.consumers:
            if not (consumer._side or consumer._stopping):
                continue
            try:
                await asyncio.wait_for(consumer.stop(grace=0), STOP_TIMEOUT)
            except TimeoutError:
                stuck.append(consumer.worker_id)
                tasks = [*consumer._side.values(), *(r.task for r in consumer._running.values() if r.task)]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        assert not stuck, f"consumers did not stop within {STOP_TIMEOUT}s: {stuck}"


class WrappedDriver:
    """Passes every operation to ``inner``; subclasses override the ones that misbehave."""

    def __init__(self, inner: Driver) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class NoStreamDriver(WrappedDriver):
    """The store as seen without change streams (a standalone server, mongomock): only polls
    and pings tell the consumer what changed."""

    async def watch(self, names: Sequence[str], resume_token: Any = None) -> AsyncIterator[ChangeEvent]:
        raise ChangeStreamUnsupported("no change streams here")
        yield  # an async generator, as watch() is


class FreezableDriver(WrappedDriver):
    """Calls of the operations in ``frozen`` hang until ``thaw`` (a stalled or partitioned worker).

    ``find_wakeups_reply`` freezes a poll after its read, so that its answer is stale on arrival.
    """

    def __init__(self, inner: Driver) -> None:
        super().__init__(inner)
        self.frozen: dict[str, asyncio.Event] = {}
        self.blocked: list[str] = []  # operations currently hanging

    def freeze(self, *operations: str) -> None:
        for op in operations:
            self.frozen.setdefault(op, asyncio.Event())

    def thaw(self, *operations: str) -> None:
        for op in operations:
            event = self.frozen.pop(op, None)
            if event is not None:
                event.set()

    async def _gate(self, op: str) -> None:
        event = self.frozen.get(op)
        if event is not None:
            self.blocked.append(op)
            try:
                await event.wait()
            finally:
                self.blocked.remove(op)

    async def claim(self, params: Any) -> Any:
        await self._gate("claim")
        return await self.inner.claim(params)

    async def ping(self, params: Any) -> Any:
        await self._gate("ping")
        return await self.inner.ping(params)

    async def finish(self, params: Any) -> Any:
        await self._gate("finish")
        return await self.inner.finish(params)

    async def heartbeat_worker(self, *args: Any) -> Any:
        await self._gate("heartbeat_worker")
        return await self.inner.heartbeat_worker(*args)

    async def find_wakeups(self, params: Any) -> Any:
        await self._gate("find_wakeups")
        found = await self.inner.find_wakeups(params)
        await self._gate("find_wakeups_reply")  # read done, reply delayed: the result goes stale
        return found


class ScriptedStreamDriver(FreezableDriver):
    """``watch()`` follows a script: each opening takes the next entry of ``openings``.

    An entry is an exception (raised when the stream is first read) or ``"stream"`` (events that
    the test pushes with ``push`` / ``push_task``, or an error with ``break_stream``). When the
    script is used up, openings stream. ``resume_tokens`` records what each opening was given.
    """

    def __init__(self, inner: Driver, openings: Sequence[BaseException | str] = ()) -> None:
        super().__init__(inner)
        self.openings = list(openings)
        self.opened = 0
        self.resume_tokens: list[Any] = []
        self._queue: asyncio.Queue[ChangeEvent | BaseException] = asyncio.Queue()
        self.streaming = asyncio.Event()

    async def watch(self, names: Sequence[str], resume_token: Any = None) -> AsyncIterator[ChangeEvent]:
        self.opened += 1
        self.resume_tokens.append(resume_token)
        step = self.openings.pop(0) if self.openings else "stream"
        if isinstance(step, BaseException):
            raise step
        self.streaming.set()
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.streaming.clear()

    def push(self, event: ChangeEvent) -> None:
        self._queue.put_nowait(event)

    def break_stream(self, exc: BaseException) -> None:
        """The open stream fails with ``exc`` (after the events pushed before)."""
        self._queue.put_nowait(exc)

    async def push_task(self, key: str) -> None:
        """Announce the task as the change stream would (its current stored form)."""
        doc = await self.inner.get_task(key)
        assert doc is not None, key
        self.push(event_for(doc, token={"_data": f"{key}-{self.opened}"}))


class FailingDriver(WrappedDriver):
    """``fail[op]`` is an exception raised by every call of ``op`` from now on."""

    def __init__(self, inner: Driver) -> None:
        super().__init__(inner)
        self.fail: dict[str, BaseException] = {}
        self.calls: dict[str, int] = {}

    async def _maybe_fail(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        exc = self.fail.get(op)
        if exc is not None:
            raise exc

    async def find_wakeups(self, params: Any) -> Any:
        await self._maybe_fail("find_wakeups")
        return await self.inner.find_wakeups(params)

    async def claim(self, params: Any) -> Any:
        await self._maybe_fail("claim")
        return await self.inner.claim(params)

    async def finish(self, params: Any) -> Any:
        await self._maybe_fail("finish")
        return await self.inner.finish(params)

    async def ping(self, params: Any) -> Any:
        await self._maybe_fail("ping")
        return await self.inner.ping(params)
