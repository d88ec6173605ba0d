"""Fault injection at the storage seam, for mscheduler's own tests and for users' tests.

``FaultyDriver`` wraps any ``Driver`` and passes every operation through, unless told to:

* fail the next calls of an operation **before** they are applied (nothing happened: a refused
  connection) or **after** (the write happened but the reply was lost: an unknown outcome, like
  PyMongo's ``AutoReconnect`` / ``NetworkTimeout`` once the command was sent);
* fail a share of calls at random (``fail_randomly``), for soak tests;
* add latency (``set_latency``);
* ``freeze`` every call until ``unfreeze`` (a consumer whose event loop stalls longer than its
  lease: advance a ``FakeClock`` meanwhile);
* ``kill`` the process: every later call raises ``DriverKilled`` and nothing more reaches the
  store, ever (no clean-up writes, as after a crash);
* drop, duplicate, reorder or break change-stream events (``set_stream_faults``, ``break_stream``).

One ``FaultyDriver`` per consumer around one shared inner driver gives each consumer its own
faults. Example::

    store = MemoryDriver(clock=fake_clock)
    a, b = FaultyDriver(store), FaultyDriver(store)
    a.fail_next("finish", after_apply=True)     # A's next finish is applied, its reply lost
    consumer_a = Consumer(a, clock=fake_clock)
    consumer_b = Consumer(b, clock=SkewedClock(fake_clock, timedelta(hours=1)))

``crash_consumer(consumer)`` kills a consumer's ``FaultyDriver`` and tears its asyncio tasks down
without letting any write through: the consumer's process died.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.listing import ListParams
from mscheduler.drivers.base import (
    AcquireParams,
    AcquireResult,
    AdvancePlansParams,
    ChangeEvent,
    ClaimedTask,
    ClaimParams,
    ControlParams,
    Driver,
    DuePlansParams,
    ExpandMapParams,
    ExpireParams,
    FinishParams,
    InsertEventsParams,
    InsertParams,
    InsertPlanParams,
    LaneParams,
    LimitOfName,
    PingParams,
    PingResult,
    PlanListParams,
    ResetStepsParams,
    RunOutcome,
    SlotsParams,
    StepResult,
    StreamPosition,
    SyncOutcome,
    SyncParentsParams,
    UpdateOptionParams,
    UpdatePlanParams,
    Wakeup,
    WakeupParams,
    WorkerInfo,
    WorkerListParams,
)

if TYPE_CHECKING:
    from mscheduler.runtime.consumer import Consumer

T = TypeVar("T")

OPERATIONS = (
    "acquire_slots",
    "update_slots",
    "limit_keys",
    "held_slots",
    "setup",
    "prepare",
    "server_time",
    "insert_tasks",
    "claim",
    "ping",
    "finish",
    "expire_leases",
    "expire_deadlines",
    "find_wakeups",
    "watch",
    "get_task",
    "list_tasks",
    "count_tasks",
    "count_by_status",
    "update_option",
    "register_worker",
    "heartbeat_worker",
    "request_worker_stop",
    "unregister_worker",
    "list_workers",
    "insert_plan",
    "get_plan",
    "list_plans",
    "update_plan",
    "delete_plan",
    "find_due_plans",
    "advance_plans",
    "get_run_outcomes",
    "insert_events",
    "sync_parents",
    "read_results",
    "expand_map",
    "reset_steps",
    "count_items",
)

BEFORE = "before"  # the call failed before reaching the store: nothing was applied
AFTER_APPLY = "after_apply"  # the call was applied, then its reply was lost: outcome unknown
STREAM = "stream"  # a change-stream fault (dropped, duplicated, reordered or broken events)


class DriverKilled(BaseException):
    """The process using this driver was killed (``FaultyDriver.kill``).

    A ``BaseException`` on purpose: code that handles storage errors (``except StorageError`` or
    ``except MSchedulerError``, even ``except Exception``) must not catch it and carry on, so no
    clean-up write of a crashed consumer ever reaches the store.
    """


@dataclass(slots=True, frozen=True)
class InjectedFault:
    """One fault that was injected: which operation, when, its arguments and the lost reply."""

    op: str
    kind: str  # BEFORE, AFTER_APPLY or STREAM
    error: BaseException | None
    args: tuple[Any, ...] = ()
    result: Any = None  # AFTER_APPLY: the reply the caller never saw (e.g. the claimed tasks)
    detail: str = ""


@dataclass(slots=True)
class _Planned:
    times: int
    after_apply: bool
    error: BaseException | None


@dataclass(slots=True)
class _Random:
    probability: float
    after_apply: bool
    error: BaseException | None
    rng: random.Random


@dataclass(slots=True)
class _StreamFaults:
    drop_every: int = 0
    duplicate_every: int = 0
    reorder_window: int = 0
    seen: int = 0
    held: list[ChangeEvent] = field(default_factory=list)


def _default_error(op: str, after_apply: bool) -> StorageError:
    if after_apply:
        return StorageError(
            f"injected: {op} applied but its reply was lost (outcome unknown)", transient=True
        )
    return StorageError(f"injected: {op} failed before it was applied", transient=True)


class FaultyDriver:
    """A ``Driver`` that delegates to ``inner`` and injects the faults it is told to.

    ``calls`` counts the calls of each operation (including failed ones); ``faults`` lists every
    fault injected, in order (``InjectedFault``). Operations not in the ``Driver`` protocol (e.g.
    ``MongoDriver.index_names``) are passed through untouched.
    """

    def __init__(self, inner: Driver) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.faults: list[InjectedFault] = []
        self.killed = False
        self._planned: dict[str, deque[_Planned]] = {}
        self._random: dict[tuple[str, bool], _Random] = {}
        self._latency: dict[str | None, float] = {}
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._stream = _StreamFaults()
        self._break_streams: deque[BaseException] = deque()

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not defined here: driver-specific extras.
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"FaultyDriver({self.inner!r}, killed={self.killed}, frozen={self.frozen})"

    # -- controls -------------------------------------------------------------------------------

    def fail_next(
        self, op: str, *, times: int = 1, after_apply: bool = False, error: BaseException | None = None
    ) -> None:
        """Make the next ``times`` calls of ``op`` raise ``error``.

        Before they are applied (default), or with ``after_apply=True`` after the inner call was
        applied (its reply is lost). The default error is ``StorageError(..., transient=True)``.
        Plans queue up in order: ``fail_next("finish"); fail_next("finish", after_apply=True)``
        fails the next finish before and the one after that after applying.
        """
        self._check_op(op)
        if times < 1:
            raise ValueError("times must be at least 1")
        self._planned.setdefault(op, deque()).append(_Planned(times, after_apply, error))

    def fail_randomly(
        self,
        op: str,
        probability: float,
        *,
        after_apply: bool = False,
        error: BaseException | None = None,
        seed: int | random.Random | None = None,
    ) -> None:
        """Make each call of ``op`` fail with ``probability`` (0 turns it off). Planned faults first.

        Failures before and after apply are set apart: call twice to have both on one operation.
        """
        self._check_op(op)
        if not 0.0 <= probability <= 1.0:
            raise ValueError("probability must be between 0 and 1")
        if probability == 0.0:
            self._random.pop((op, after_apply), None)
            return
        rng = seed if isinstance(seed, random.Random) else random.Random(seed)
        self._random[(op, after_apply)] = _Random(probability, after_apply, error, rng)

    def clear_faults(self) -> None:
        """Forget planned and random faults, latency and stream faults (not ``kill`` or ``freeze``)."""
        self._planned.clear()
        self._random.clear()
        self._latency.clear()
        self._stream = _StreamFaults()
        self._break_streams.clear()

    def set_latency(self, seconds: float, op: str | None = None) -> None:
        """Delay calls of ``op`` (every operation when None) by ``seconds`` (``asyncio.sleep``)."""
        if op is not None:
            self._check_op(op)
        if seconds < 0:
            raise ValueError("latency must not be negative")
        if seconds == 0:
            self._latency.pop(op, None)
        else:
            self._latency[op] = seconds

    def freeze(self) -> None:
        """Block every call (new and in-flight before the store) until ``unfreeze``."""
        self._thawed.clear()

    def unfreeze(self) -> None:
        self._thawed.set()

    @property
    def frozen(self) -> bool:
        return not self._thawed.is_set()

    def kill(self) -> None:
        """A crash: every later call (and every blocked one) raises ``DriverKilled``; nothing more
        is applied, ever. Irreversible."""
        self.killed = True
        self._thawed.set()  # wake the blocked calls so that they die

    def set_stream_faults(
        self, *, drop_every: int = 0, duplicate_every: int = 0, reorder_window: int = 0
    ) -> None:
        """Change-stream faults, deterministic: drop every n-th event, deliver every n-th event
        twice, or hold events back in windows of n and deliver each window in reverse order."""
        for value in (drop_every, duplicate_every, reorder_window):
            if value < 0:
                raise ValueError("stream fault settings must not be negative")
        self._stream = _StreamFaults(drop_every, duplicate_every, reorder_window)

    def break_stream(self, error: BaseException | None = None) -> None:
        """The next change event raises ``error`` instead (default: a transient StorageError),
        ending the stream, as a network error or a failover does."""
        self._break_streams.append(error or StorageError("injected: change stream broke", transient=True))

    @property
    def injected(self) -> Counter[tuple[str, str]]:
        """How many faults of each (op, kind) were injected."""
        return Counter((f.op, f.kind) for f in self.faults)

    # -- plumbing -------------------------------------------------------------------------------

    @staticmethod
    def _check_op(op: str) -> None:
        if op not in OPERATIONS:
            raise ValueError(f"unknown driver operation {op!r}; one of {', '.join(OPERATIONS)}")

    def _take_fault(self, op: str) -> tuple[bool, BaseException | None] | None:
        plans = self._planned.get(op)
        if plans:
            plan = plans[0]
            plan.times -= 1
            if plan.times == 0:
                plans.popleft()
            return plan.after_apply, plan.error
        for after_apply in (False, True):
            chance = self._random.get((op, after_apply))
            if chance is not None and chance.rng.random() < chance.probability:
                return chance.after_apply, chance.error
        return None

    async def _gate(self, op: str) -> None:
        """Count the call, then wait out freezes and latency; die if killed meanwhile."""
        if self.killed:
            raise DriverKilled(f"{op}: the driver was killed")
        self.calls[op] += 1
        while not self._thawed.is_set():
            await self._thawed.wait()
        latency = self._latency.get(op, self._latency.get(None, 0.0))
        if latency > 0:
            await asyncio.sleep(latency)
        while not self._thawed.is_set():  # frozen during the latency
            await self._thawed.wait()
        if self.killed:
            raise DriverKilled(f"{op}: the driver was killed")

    async def _invoke(self, op: str, call: Callable[[], Awaitable[T]], *args: Any) -> T:
        await self._gate(op)
        fault = self._take_fault(op)
        if fault is not None and not fault[0]:
            error = fault[1] or _default_error(op, after_apply=False)
            self.faults.append(InjectedFault(op, BEFORE, error, args))
            raise error.with_traceback(None)
        result = await call()
        if self.killed:  # killed while the store worked: it may have applied, nobody hears
            raise DriverKilled(f"{op}: the driver was killed")
        if fault is not None:
            error = fault[1] or _default_error(op, after_apply=True)
            self.faults.append(InjectedFault(op, AFTER_APPLY, error, args, result))
            raise error.with_traceback(None)
        return result

    # -- the Driver protocol ----------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    async def setup(self) -> None:
        await self._invoke("setup", self.inner.setup)

    async def prepare(self) -> None:
        await self._invoke("prepare", self.inner.prepare)

    async def server_time(self) -> datetime | None:
        return await self._invoke("server_time", self.inner.server_time)

    async def insert_tasks(self, params: InsertParams) -> list[bool]:
        return await self._invoke("insert_tasks", lambda: self.inner.insert_tasks(params), params)

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        return await self._invoke("claim", lambda: self.inner.claim(params), params)

    async def ping(self, params: PingParams) -> PingResult:
        return await self._invoke("ping", lambda: self.inner.ping(params), params)

    async def finish(self, params: Sequence[FinishParams]) -> list[bool]:
        return await self._invoke("finish", lambda: self.inner.finish(params), params)

    async def expire_leases(self, params: ExpireParams) -> int:
        return await self._invoke("expire_leases", lambda: self.inner.expire_leases(params), params)

    async def expire_deadlines(self, params: ExpireParams) -> int:
        return await self._invoke("expire_deadlines", lambda: self.inner.expire_deadlines(params), params)

    async def find_wakeups(self, params: WakeupParams) -> list[Wakeup]:
        return await self._invoke("find_wakeups", lambda: self.inner.find_wakeups(params), params)

    async def find_lanes(self, params: LaneParams) -> list[str]:
        return await self._invoke("find_lanes", lambda: self.inner.find_lanes(params), params)

    async def watch(
        self, names: Sequence[str], resume_token: Any = None
    ) -> AsyncIterator[ChangeEvent | StreamPosition]:
        await self._gate("watch")
        fault = self._take_fault("watch")
        if fault is not None:  # opening a stream applies nothing: every fault is a "before" one
            error = fault[1] or _default_error("watch", after_apply=False)
            self.faults.append(InjectedFault("watch", BEFORE, error, (names, resume_token)))
            raise error.with_traceback(None)
        stream = self.inner.watch(names, resume_token)
        try:
            async for event in stream:
                if isinstance(event, StreamPosition):  # positions are not events: never faulted
                    yield event
                    continue
                for out in self._stream_filter(event):
                    await self._gate("watch_event")
                    if self._break_streams:
                        error = self._break_streams.popleft()
                        self.faults.append(InjectedFault("watch", STREAM, error, (), out, "broken"))
                        raise error.with_traceback(None)
                    yield out
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()

    def _stream_filter(self, event: ChangeEvent) -> list[ChangeEvent]:
        s = self._stream
        s.seen += 1
        if s.drop_every and s.seen % s.drop_every == 0:
            self.faults.append(InjectedFault("watch", STREAM, None, (), event, "dropped"))
            return []
        out = [event]
        if s.duplicate_every and s.seen % s.duplicate_every == 0:
            self.faults.append(InjectedFault("watch", STREAM, None, (), event, "duplicated"))
            out.append(event)
        if s.reorder_window > 1:
            s.held.extend(out)
            if len(s.held) < s.reorder_window:
                return []
            out, s.held = s.held[::-1], []
            self.faults.append(InjectedFault("watch", STREAM, None, (), tuple(out), "reordered"))
        return out

    async def get_task(self, key: str) -> dict[str, Any] | None:
        return await self._invoke("get_task", lambda: self.inner.get_task(key), key)

    async def list_tasks(self, params: ListParams) -> list[dict[str, Any]]:
        return await self._invoke("list_tasks", lambda: self.inner.list_tasks(params), params)

    async def count_tasks(self, params: ListParams, cap: int) -> int:
        return await self._invoke("count_tasks", lambda: self.inner.count_tasks(params, cap), params)

    async def count_by_status(self) -> dict[str, int]:
        return await self._invoke("count_by_status", self.inner.count_by_status)

    async def update_option(self, params: UpdateOptionParams) -> bool:
        return await self._invoke("update_option", lambda: self.inner.update_option(params), params)

    async def control_task(self, params: ControlParams) -> dict[str, Any] | None:
        return await self._invoke("control_task", lambda: self.inner.control_task(params), params)

    async def register_worker(self, info: WorkerInfo) -> bool:
        return await self._invoke("register_worker", lambda: self.inner.register_worker(info), info)

    async def heartbeat_worker(self, worker_id: str, now: datetime, running_cnt: int) -> bool:
        return await self._invoke(
            "heartbeat_worker",
            lambda: self.inner.heartbeat_worker(worker_id, now, running_cnt),
            worker_id,
            now,
            running_cnt,
        )

    async def request_worker_stop(self, worker_id: str, now: datetime) -> bool:
        return await self._invoke(
            "request_worker_stop", lambda: self.inner.request_worker_stop(worker_id, now), worker_id, now
        )

    async def unregister_worker(self, worker_id: str, now: datetime) -> None:
        await self._invoke(
            "unregister_worker", lambda: self.inner.unregister_worker(worker_id, now), worker_id, now
        )

    async def list_workers(self, params: WorkerListParams | None = None) -> list[dict[str, Any]]:
        return await self._invoke("list_workers", lambda: self.inner.list_workers(params), params)

    async def insert_plan(self, params: InsertPlanParams) -> bool:
        return await self._invoke("insert_plan", lambda: self.inner.insert_plan(params), params)

    async def get_plan(self, plan_id: str) -> dict[str, Any] | None:
        return await self._invoke("get_plan", lambda: self.inner.get_plan(plan_id), plan_id)

    async def list_plans(self, params: PlanListParams) -> list[dict[str, Any]]:
        return await self._invoke("list_plans", lambda: self.inner.list_plans(params), params)

    async def update_plan(self, params: UpdatePlanParams) -> bool:
        return await self._invoke("update_plan", lambda: self.inner.update_plan(params), params)

    async def delete_plan(self, plan_id: str) -> bool:
        return await self._invoke("delete_plan", lambda: self.inner.delete_plan(plan_id), plan_id)

    async def find_due_plans(self, params: DuePlansParams) -> list[dict[str, Any]]:
        return await self._invoke("find_due_plans", lambda: self.inner.find_due_plans(params), params)

    async def advance_plans(self, params: AdvancePlansParams) -> int:
        return await self._invoke("advance_plans", lambda: self.inner.advance_plans(params), params)

    async def get_run_outcomes(self, keys: Sequence[str]) -> dict[str, RunOutcome]:
        return await self._invoke("get_run_outcomes", lambda: self.inner.get_run_outcomes(keys), keys)

    async def insert_events(self, params: InsertEventsParams) -> int:
        return await self._invoke("insert_events", lambda: self.inner.insert_events(params), params)

    async def sync_parents(self, params: SyncParentsParams) -> SyncOutcome:
        return await self._invoke("sync_parents", lambda: self.inner.sync_parents(params), params)

    async def read_results(self, keys: Sequence[str]) -> dict[str, StepResult]:
        return await self._invoke("read_results", lambda: self.inner.read_results(keys), keys)

    async def expand_map(self, params: ExpandMapParams) -> bool:
        return await self._invoke("expand_map", lambda: self.inner.expand_map(params), params)

    async def reset_steps(self, params: ResetStepsParams) -> int:
        return await self._invoke("reset_steps", lambda: self.inner.reset_steps(params), params)

    async def count_items(self, key: str) -> dict[str, int]:
        return await self._invoke("count_items", lambda: self.inner.count_items(key), key)

    async def acquire_slots(self, params: AcquireParams) -> AcquireResult:
        return await self._invoke("acquire_slots", lambda: self.inner.acquire_slots(params), params)

    async def update_slots(self, params: SlotsParams) -> list[str]:
        return await self._invoke("update_slots", lambda: self.inner.update_slots(params), params)

    async def held_slots(self, worker_id: str, attempts: Sequence[str], now: datetime) -> dict[str, str]:
        return await self._invoke(
            "held_slots", lambda: self.inner.held_slots(worker_id, attempts, now), worker_id, attempts, now
        )

    async def limit_keys(self, names: Sequence[str]) -> dict[str, LimitOfName]:
        return await self._invoke("limit_keys", lambda: self.inner.limit_keys(names), names)


async def crash_consumer(consumer: Consumer, *, patience: float = 5.0) -> None:
    """Kill ``consumer`` as a process crash would: no write of it reaches the store any more.

    Its driver must be a ``FaultyDriver`` (it is killed first, so every clean-up write the
    consumer attempts raises ``DriverKilled``); then its side tasks and running handlers are
    cancelled and awaited, so that the test's event loop is left tidy. Its leases stay in the
    store until they expire, as a dead process's would.
    """
    driver = consumer.driver
    if not isinstance(driver, FaultyDriver):
        raise TypeError("crash_consumer needs a consumer built on a FaultyDriver")
    driver.kill()
    consumer._stopping = True  # a later stop() must not try to clean up: the process is gone
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    seen: list[asyncio.Future[Any]] = []
    # A handler cancelled once may still wait on its (never written) outcome, and a side task
    # that died of DriverKilled may have started a stop task: collect and cancel until all end.
    while True:
        tasks: list[asyncio.Future[Any]] = [*consumer._side.values()]
        tasks += [r.task for r in consumer._running.values() if r.task is not None]
        if consumer._stop_task is not None:
            tasks.append(consumer._stop_task)
        seen += [t for t in tasks if t not in seen]
        live = [t for t in seen if not t.done()]
        if not live:
            break
        if loop.time() > deadline:
            raise TimeoutError(f"crash_consumer: {len(live)} tasks of {consumer.worker_id} would not end")
        for t in live:
            t.cancel()
        await asyncio.wait(live, timeout=0.05)
    for t in seen:  # retrieve every exception (DriverKilled mostly) so none is reported later
        if not t.cancelled():
            t.exception()
    if consumer.error is None:
        consumer.error = DriverKilled(f"consumer {consumer.worker_id} crashed (crash_consumer)")
    consumer._stopped.set()
