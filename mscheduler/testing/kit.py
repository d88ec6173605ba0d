"""A scheduler for an app's tests, wired in one call on one fake clock.

``scheduler_kit(app)`` builds a store (the memory driver, or ``MongoDriver`` on mongomock), a
publisher, the app's consumers and an ``Operations``, every one of them on the same
``FakeClock`` — there is no second clock to forget::

    async with scheduler_kit(app) as kit:
        await kit.publisher.send(Task("invoice-42", "send_invoice", {...}))
        assert await kit.publisher.wait("invoice-42") == {...}

``kit.publisher.wait(key)`` (and ``kit.run(key)``) *drives* the fake clock: it lets whatever is
ready run; while a handler is running (in a thread, a process, or awaiting real I/O) it waits for
it; when nothing is running it moves the clock straight to the next thing due (a retry's time, a
``run_at``, a poll), so retries an hour apart take no real time. It stops with ``TimeoutError``
when the task cannot end (no consumer handles its name, it is paused) or after ``max_time`` of
fake time.

``scheduler_kit(app, eager=True)``: every ``send`` runs the task to its end before it returns,
through the real claim, lease, ping and finish (like Celery's ``task_always_eager``); the
outcome is stored as in production. What it does not show: tasks running at the same time (each
send runs to its end alone, so no concurrency or flow limit is exercised), leases running out
(nothing crashes), a worker being stopped, and real time (retry delays and ``run_at`` pass on
the fake clock at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any, Literal

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import Task, TaskInfo, TaskStatus
from mscheduler.drivers.base import Driver
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.operations import Operations
from mscheduler.runtime.app import App
from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.publisher import Publisher
from mscheduler.runtime.sync_publisher import SyncPublisher
from mscheduler.testing.clock import FakeClock

Store = Literal["memory", "mongomock"]
SETTLE_ROUNDS = 50  # loop turns that let whatever is ready run (the stores never really wait)
HANDLER_WAIT = 30.0  # real seconds a running handler may take before fake time moves anyway
DEFAULT_MAX_TIME = timedelta(days=1)
_ENDED = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.EXPIRED)


async def settle(rounds: int = SETTLE_ROUNDS) -> None:
    """Let every task that is ready run, without moving any clock."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class SchedulerKit:
    """A store, a publisher, consumers and operations on one ``FakeClock`` (see the module doc).
    An async context manager: the consumers run inside it; ``start`` / ``stop`` otherwise."""

    def __init__(
        self,
        app: App,
        *,
        store: Store = "memory",
        clock: FakeClock | None = None,
        eager: bool = False,
        events: bool = True,
        **consumer_settings: Any,
    ) -> None:
        if not isinstance(app, App):
            raise InvalidInput(
                f"scheduler_kit() takes an App or a dict of handlers, got {type(app).__name__}"
            )
        if clock is not None and not isinstance(clock, FakeClock):
            raise InvalidInput(f"clock: a FakeClock, got {type(clock).__name__}")
        self.app = app
        self.clock = clock or FakeClock()
        self.driver = _store(store, self.clock, events)
        self.eager = eager
        consumer_settings.setdefault("poll_interval", 1.0)
        self.consumers: list[Consumer] = app.consumers(self.driver, clock=self.clock, **consumer_settings)
        self.publisher: KitPublisher = KitPublisher(self, self.driver, clock=self.clock)
        self.operations = Operations(self.driver, clock=self.clock)
        self._started = False

    async def __aenter__(self) -> SchedulerKit:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the consumers (and create the app's plans)."""
        if self._started:
            return
        for consumer in self.consumers:
            await consumer.start()
        self._started = True
        await self.app.add_plans(self.operations)
        await settle()

    async def stop(self) -> None:
        """Stop the consumers at once (running handlers are cancelled and released)."""
        if self._started:
            await asyncio.gather(*(c.stop(grace=0) for c in self.consumers))
            self._started = False

    def sync_publisher(self) -> SyncPublisher:
        """A ``SyncPublisher`` over the kit's publisher, on the kit's loop, for the synchronous
        code under test (a Flask or Django view): call that code in another thread
        (``await asyncio.to_thread(view, ...)``) while the test awaits; its ``wait`` drives the
        fake clock as ``kit.publisher.wait`` does, and ``eager`` applies to its sends."""
        return SyncPublisher(self.publisher, loop=asyncio.get_running_loop())

    @property
    def names(self) -> set[str]:
        return {name for c in self.consumers for name in c._handlers}

    async def advance(self, seconds: float | timedelta) -> None:
        """Move the fake clock by ``seconds`` and let what woke up run."""
        await settle()
        self.clock.advance(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))
        await settle()

    async def run(self, key: str, *, max_time: timedelta = DEFAULT_MAX_TIME) -> TaskInfo:
        """Drive the fake clock until task ``key`` has ended; the task then."""
        if not self._started:
            await self.start()
        ended: list[TaskInfo] = []

        async def done() -> bool:
            info = await self.operations.get_task(key)
            if info.status in _ENDED:
                ended.append(info)
                return True
            await self._check_runnable(info)
            return False

        await self.drive(done, max_time=max_time, what=f"task {key!r}", due=lambda: self._due(key))
        return ended[-1]

    async def drive(
        self,
        done: Callable[[], Awaitable[bool]],
        *,
        max_time: timedelta = DEFAULT_MAX_TIME,
        what: str = "the condition",
        due: Callable[[], Awaitable[float | None]] | None = None,
    ) -> None:
        """Run until ``done()``: let ready work run, wait for running handlers, else move the fake
        clock to the next thing due (``due()``: a wake-up the caller knows of, in ``monotonic``
        time) or the next sleeper. ``TimeoutError`` after ``max_time`` of fake time."""
        start = self.clock.monotonic()
        limit = start + max_time.total_seconds()
        while True:
            await settle()
            if await done():
                return
            busy = [
                r.task
                for c in self.consumers
                for r in c._running.values()  # the kit reads its own consumers' attempts
                if r.task is not None and not r.task.done()
            ]
            if busy:
                finished, _ = await asyncio.wait(
                    busy, timeout=HANDLER_WAIT, return_when=asyncio.FIRST_COMPLETED
                )
                if finished:
                    continue
            now = self.clock.monotonic()
            wake = self.clock.next_deadline()
            if due is not None and not any(c.running_count for c in self.consumers):
                # nothing runs, so no lease needs its pings: straight to when the task is due
                known = await due()
                if known is not None and known > now:
                    wake = known
            if wake is None:
                raise TimeoutError(f"{what} did not come about, and nothing is due to happen")
            if wake > limit:
                shown = max_time.total_seconds()
                raise TimeoutError(f"{what} did not come about within {shown:g} s of fake time")
            self.clock.advance(max(wake - now, 0.0))

    async def _due(self, key: str) -> float | None:
        """When (``monotonic`` time) the task or one of its children may next be claimed."""
        info = await self.operations.get_task(key)
        infos = [info, *[await self.operations.get_task(c.key) for c in info.children or ()]]
        times = [i.claim_at for i in infos if i.claim_at is not None and i.status not in _ENDED]
        if not times:
            return None
        ahead = (min(times) - self.clock.now()).total_seconds()
        return self.clock.monotonic() + max(ahead, 0.0)

    async def _check_runnable(self, info: TaskInfo) -> None:
        """A pending task that nothing here can run: say why at once (not after ``max_time``)."""
        if info.status is not TaskStatus.PENDING or info.running_cnt:
            return
        if info.paused:
            raise TimeoutError(f"task {info.key!r} is paused: resume it to let it run")
        names = [c.name for c in info.children] if info.children else [info.name]
        missing = [n for n in names if n not in self.names]
        if missing:
            raise TimeoutError(
                f"task {info.key!r} needs a handler for {', '.join(repr(m) for m in missing)}, "
                f"and the app handles {sorted(self.names)}"
            )


class KitPublisher(Publisher):
    """The kit's publisher: ``wait`` drives the fake clock; with ``eager`` every ``send`` runs
    the task to its end before it returns."""

    def __init__(self, kit: SchedulerKit, driver: Driver, *, clock: FakeClock) -> None:
        super().__init__(driver, clock=clock)
        self.kit = kit

    async def wait(
        self,
        key: str,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.05,
        max_poll_interval: float = 1.0,
    ) -> Any:
        """``Publisher.wait`` on the fake clock: the task is run to its end (``timeout``: seconds
        of fake time, by default a day), then its result is returned or its failure raised."""
        limit = DEFAULT_MAX_TIME if timeout is None else timedelta(seconds=timeout)
        await self.kit.run(key, max_time=limit)
        return await super().wait(key, timeout=0)

    async def send(
        self, task: Task, *, reset_finished: bool = False, session: Any = None, by: str | None = None
    ) -> bool:
        created = await super().send(task, reset_finished=reset_finished, session=session, by=by)
        if self.kit.eager and isinstance(task, Task):
            await self.kit.run(task.key)
        return created

    async def send_many(
        self, tasks: Any, *, reset_finished: bool = False, session: Any = None, by: str | None = None
    ) -> list[bool]:
        tasks = list(tasks)
        created = await super().send_many(tasks, reset_finished=reset_finished, session=session, by=by)
        if self.kit.eager:
            for task in tasks:
                await self.kit.run(task.key)
        return created


def _store(store: Store, clock: FakeClock, events: bool) -> Driver:
    if store == "memory":
        return MemoryDriver(clock=clock, events=events)
    if store == "mongomock":
        from mscheduler.drivers.mongo.driver import MongoDriver
        from mscheduler.testing.mongomock import mongomock_database

        return MongoDriver(mongomock_database(), events=events, create_indexes=True)
    raise InvalidInput(f"store: 'memory' or 'mongomock', got {store!r}")


def scheduler_kit(
    app: App | Mapping[str, Callable[..., Any]],
    *,
    store: Store = "memory",
    clock: FakeClock | None = None,
    eager: bool = False,
    events: bool = True,
    **consumer_settings: Any,
) -> SchedulerKit:
    """A ``SchedulerKit`` for ``app`` (an ``App``, or ``{task name: handler}``) on ``store``
    (``"memory"``, or ``"mongomock"`` for ``MongoDriver``'s own queries: needs
    ``mscheduler[testing]``), all on one ``FakeClock`` (``clock``, or a new one); ``eager``: each
    ``send`` runs its task to the end; ``consumer_settings`` apply to every consumer."""
    if isinstance(app, Mapping):
        handlers, app = app, App("test")
        for name, fn in handlers.items():
            app.register(name, fn)
    return SchedulerKit(app, store=store, clock=clock, eager=eager, events=events, **consumer_settings)
