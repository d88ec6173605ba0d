"""The Consumer: claims tasks, runs handlers, keeps leases alive, writes outcomes.

Side tasks, each named and supervised (one dying stops the consumer loudly):

* ``poller`` and ``watcher`` (``Discovery``, discovery.py): fill the wake-up queue;
* ``claimer`` (claimer.py): sleeps until a task may be claimable, then claims up to the free slots;
* ``pinger`` (pinger.py): one write per interval renews the leases of all running attempts;
* ``finisher`` (finisher.py): writes outcomes in batches (whatever piled up while the last write
  was in flight);
* ``heartbeat``: the worker registry (remote stop) and the server clock offset.

This module holds the constructor, registration, the lifecycle and supervision, and the small
parts (events, child tasks, planner, storage errors, heartbeat). The claimer, the pinger, the
finisher and running a handler (runner.py, with ``TaskContext``) are mixins of ``Consumer`` in
their own modules; each declares the consumer's attributes and methods it uses.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from mscheduler.domain.clock import Clock, ServerClock, check_same_time
from mscheduler.domain.exceptions import (
    ConsumerStopped,
    InvalidInput,
    MSchedulerError,
    StorageError,
)
from mscheduler.domain.fairness import Fairness
from mscheduler.domain.model import (
    AttemptStatus,
    validate_group,
    validate_name,
    validate_worker_id,
)
from mscheduler.domain.outcomes import DEFAULT_MAX_RESULT_BYTES, fails_for_good
from mscheduler.drivers.base import (
    DEFAULT_MAX_ENTRIES,
    ClaimedTask,
    Driver,
    FinishParams,
    NewTask,
    WorkerInfo,
    allowed,
)
from mscheduler.observability.tracing import tracer_for
from mscheduler.runtime.consumer.claimer import ConsumerClaimer
from mscheduler.runtime.consumer.discovery import Discovery
from mscheduler.runtime.consumer.finisher import ConsumerFinisher, PendingOutcome
from mscheduler.runtime.consumer.handlers import (
    Handler,
    HandlerPools,
    Registered,
    RunIn,
    default_process_count,
    inspect_handler,
    params_schema_text,
)
from mscheduler.runtime.consumer.inputs import StepInputs
from mscheduler.runtime.consumer.limiter import Limiter
from mscheduler.runtime.consumer.pinger import ConsumerPinger
from mscheduler.runtime.consumer.reports import DEFAULT_MAX_CHECKPOINT_BYTES
from mscheduler.runtime.consumer.runner import (
    ConsumerRunner,
    Listener,
    RunningAttempt,
)
from mscheduler.services.children import ChildSync
from mscheduler.services.events import EventKind, EventRecorder
from mscheduler.services.planner import Planner
from mscheduler.services.retention import Retention, RetentionService

log = logging.getLogger("mscheduler.consumer")

ERROR_BACKOFF = 5.0  # seconds a side task waits after a storage error no retry fixed


class Consumer(ConsumerClaimer, ConsumerRunner, ConsumerFinisher, ConsumerPinger):
    """Runs registered handlers for claimed tasks.

    :param driver: the storage.
    :param worker_id: unique per running consumer; default ``host-pid-random``. Tasks name it in
        ``specific_worker_ids``.
    :param concurrency: handlers run at once by this consumer.
    :param poll_interval: seconds between polls when no change stream is open (the floor).
    :param stream_poll_interval: seconds between polls while a change stream is healthy.
    :param max_result_bytes: the largest result a handler may return (its BSON size); a larger
        one fails the task at once, without retries (a result is deterministic), with the reason.
    :param max_checkpoint_bytes: the largest checkpoint a handler may save (``ctx.checkpoint``,
        its BSON size); a larger one raises ``InvalidInput`` in the handler, nothing is saved.
    :param planner: run a planner as a side task (on by default): it turns due occurrences of
        recurring plans into tasks. Any number of consumers (and ``mscheduler planner``) may run
        one at once; none is special (see docs/plans.md). ``planner=False`` turns it off.
    :param planner_interval: seconds between the planner's passes.
    :param retention: run the retention service as a side task (``mscheduler.services.retention``):
        finished tasks are removed after these periods. None (the default): this consumer
        removes nothing. Any number of consumers may run one; give them the same periods.
    :param retention_interval: seconds between the retention passes.
    :param children_interval: seconds between passes of the child-task reconciler, which syncs
        parents whose summary lags their children (``mscheduler.services.children``); a child's claim or
        finish by this consumer is followed by its parent's sync at once.
    :param max_attempt_entries: attempt entries a task keeps; a claim beyond it drops the task's
        oldest entries that do not count (released, revoked, snoozed).
    :param grace_period: on graceful stop, how long running handlers may take to finish before
        they are cancelled and their leases released.
    :param groups: the groups this consumer belongs to: it also runs tasks whose
        ``specific_groups`` name one of them.
    :param limits_interval: seconds between reads of which flow limits (``Operations.set_limit``)
        cover this consumer's names; a new or removed limit applies from the next read. Limit
        values are read by every acquire, so an edited ``max_running`` or rate applies at once.
    :param limit_backoff: after a limit refused a slot, about this many seconds (jittered) before
        this consumer asks again (a rate limit: until its window frees a start).
    :param limit_reserve: for limits without a rate that are far from their ``max_running``, ask
        for several claim batches' slots at once and use the spare ones for the next claims (one
        acquire per 4 claims instead of one per claim; spare slots count as running). On by
        default; a rate added to such a limit later counts the reserved grants as starts (see
        ``mscheduler.domain.limits.pre_rate_slot``).
    :param claim_lease: an optional cap on the first lease of a claim. The first lease is the
        task's own ``worker_timeout`` (computed by the store inside the claim); with a cap,
        ``min(worker_timeout, claim_lease)``. None (the default): no cap.
    :param tracing: OpenTelemetry spans around claims and attempts, each attempt's a child of
        the task's sender (``mscheduler.observability.tracing``); None follows its ``enable()``.
    :param thread_pool_size: threads running plain (non-async) handlers; default ``concurrency``.
    :param process_pool_size: processes running ``run_in="process"`` handlers; default
        ``concurrency``, at most the number of CPUs.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        worker_id: str | None = None,
        concurrency: int = 10,
        poll_interval: float = 1.0,
        stream_poll_interval: float = 10.0,
        grace_period: float = 30.0,
        heartbeat_interval: float = 5.0,
        claim_lease: timedelta | None = None,
        max_claim_batch: int = 64,
        wakeup_queue_size: int = 10_000,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        planner: bool = True,
        planner_interval: float = 1.0,
        retention: Retention | None = None,
        retention_interval: float = 60.0,
        children_interval: float = 10.0,
        max_attempt_entries: int = DEFAULT_MAX_ENTRIES,
        groups: Sequence[str] = (),
        limits_interval: float = 2.0,
        limit_backoff: float = 0.2,
        limit_reserve: bool = True,
        fairness: Fairness | None = None,
        clock: Clock | None = None,
        host: str | None = None,
        tracing: bool | None = None,
        thread_pool_size: int | None = None,
        process_pool_size: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidInput("concurrency must be at least 1")
        for label, size in (("thread_pool_size", thread_pool_size), ("process_pool_size", process_pool_size)):
            bad = not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= 1024
            if size is not None and bad:
                raise InvalidInput(f"{label} must be an integer from 1 to 1024")
        if poll_interval <= 0 or stream_poll_interval <= 0 or heartbeat_interval <= 0:
            raise InvalidInput("intervals must be positive")
        if grace_period < 0 or (claim_lease is not None and claim_lease <= timedelta(0)):
            raise InvalidInput("grace_period must be >= 0 and claim_lease positive")
        if not 1 <= max_result_bytes <= 15 * 1024 * 1024:
            raise InvalidInput("max_result_bytes must be between 1 byte and 15 MiB")
        if not 1 <= max_checkpoint_bytes <= 15 * 1024 * 1024:
            raise InvalidInput("max_checkpoint_bytes must be between 1 byte and 15 MiB")
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.driver = driver
        self.inputs = StepInputs(driver)  # workflow steps' inputs, read per claim batch
        self.host = host or socket.gethostname()
        self.pid = os.getpid()
        self.worker_id = worker_id or f"{self.host}-{self.pid}-{secrets.token_hex(3)}"
        for label, value in (("worker id", self.worker_id), ("host", self.host)):
            if not value or value.startswith("$") or len(value) > 200:
                raise InvalidInput(f"invalid {label} {value!r}")
        try:
            validate_worker_id(self.worker_id)
            if isinstance(groups, (str, bytes)):
                raise ValueError("groups: a list of group names, not one string")
            self.groups: tuple[str, ...] = tuple(dict.fromkeys(validate_group(g) for g in groups))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from exc
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.stream_poll_interval = stream_poll_interval
        self.grace_period = grace_period
        self.heartbeat_interval = heartbeat_interval
        self.claim_lease = claim_lease
        self.max_claim_batch = max_claim_batch
        self.wakeup_queue_size = wakeup_queue_size
        self.max_result_bytes = max_result_bytes
        if planner and not 0 < planner_interval <= 3600:
            raise InvalidInput("planner_interval must be more than 0 and at most 3600 seconds")
        self.planner_enabled = planner
        self.planner_interval = planner_interval
        self.planner: Planner | None = None
        if not 0 < children_interval <= 3600:
            raise InvalidInput("children_interval must be more than 0 and at most 3600 seconds")
        self.children_interval = children_interval
        self.child_sync: ChildSync | None = None
        if retention is not None and not isinstance(retention, Retention):
            raise InvalidInput(f"retention: a Retention or None, got {type(retention).__name__}")
        if not 0 < retention_interval <= 86_400:
            raise InvalidInput("retention_interval must be more than 0 and at most 86,400 seconds")
        if not isinstance(max_attempt_entries, int) or not 1 <= max_attempt_entries <= 10_000:
            raise InvalidInput("max_attempt_entries must be an integer from 1 to 10,000")
        self.retention = retention
        self.retention_interval = retention_interval
        self.retention_service: RetentionService | None = None
        self.max_attempt_entries = max_attempt_entries
        if not 0 < limits_interval <= 3600 or not 0 < limit_backoff <= 60:
            raise InvalidInput("limits_interval must be in (0, 3600] and limit_backoff in (0, 60] seconds")
        if fairness is not None and not isinstance(fairness, Fairness):
            raise InvalidInput(f"fairness: a Fairness or None, got {type(fairness).__name__}")
        self.fairness = fairness
        check_same_time(driver, clock, "this Consumer")
        self.clock = ServerClock(clock) if not isinstance(clock, ServerClock) else clock
        self._handlers: dict[str, Registered] = {}
        # plain handlers' threads and run_in="process" handlers' processes (handlers.py)
        self.pools = HandlerPools(
            thread_pool_size or concurrency,
            process_pool_size or default_process_count(concurrency),
            self.worker_id,
        )
        self._listeners: list[Listener] = []
        self._tracer = tracer_for(tracing)
        if self._tracer is not None:
            self._listeners.append(self._tracer.on_consumer_event)
        self._running: dict[str, RunningAttempt] = {}
        # untargeted fan-out tasks this worker succeeded on, newest last (see runner.RAN_FANOUT_KEPT)
        self._ran_fanout: OrderedDict[str, None] = OrderedDict()
        self._handlers_active = 0
        self._slot_freed = asyncio.Event()
        self._pending: list[PendingOutcome] = []
        self._pending_added = asyncio.Event()
        self._ping_wake = asyncio.Event()
        self._ping_now = asyncio.Event()  # a checkpoint waits, or a stop needs the store's word
        self._progress_set = asyncio.Event()  # a handler reported progress since the last ping
        self._last_ping = float("-inf")  # when the last ping was sent (the clock's monotonic time)
        self._side: dict[str, asyncio.Task[None]] = {}
        self._stopping = False
        self._stopped = asyncio.Event()
        self._stop_task: asyncio.Task[None] | None = None
        self._shutdown_task: asyncio.Task[None] | None = None
        self._claim_call: asyncio.Future[list[ClaimedTask]] | None = None
        self._hurry = asyncio.Event()  # a second stop(grace=0): stop waiting for anything
        self.error: BaseException | None = None
        self.stop_reason: str | None = None  # why it stopped (or is stopping): see ``state``
        self.rng = random.Random()  # retry jitter; tests may seed or replace it
        # flow limits: slots acquired before claims of limited names, see limiter.py
        self.limiter = Limiter(
            driver,
            refresh=limits_interval,
            backoff=limit_backoff,
            slot_lease=claim_lease,
            rng=self.rng,
            reserve=limit_reserve,
        )
        self.discovery: Discovery | None = None
        self.stats = {"claimed": 0, "succeeded": 0, "failed": 0, "lost": 0, "released": 0, "rejected": 0}
        # the buffer of claim and outcome events, when the store records events (mscheduler.services.events)
        self.events: EventRecorder | None = None

    # -- registration -------------------------------------------------------------------------

    def register(self, name: str, fn: Handler, *, run_in: RunIn | None = None) -> None:
        """Run ``fn`` for tasks named ``name``: ``fn(params)`` or ``fn(params, ctx)``.

        ``async def`` handlers run on the event loop; plain functions (and partials, callable
        objects, bound methods) in the consumer's thread pool, with a ``SyncTaskContext``;
        ``run_in="process"`` runs a plain, picklable function in the process pool (CPU-bound
        work: params and result are pickled). See ``handlers`` for what cancelling an attempt
        running in a thread or a process does. When ``params`` is annotated with a pydantic model,
        the stored params are validated into it; invalid params fail the task at once with the
        validation message (no retries).
        """
        try:
            validate_name(name)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from exc
        if name in self._handlers:
            raise InvalidInput(f"a handler for {name!r} is already registered")
        if self._side:
            raise InvalidInput("register handlers before the consumer starts")
        self._handlers[name] = inspect_handler(name, fn, run_in, self.pools)

    def handler(self, name: str, *, run_in: RunIn | None = None) -> Callable[[Handler], Handler]:
        """Decorator form of ``register``."""

        def decorate(fn: Handler) -> Handler:
            self.register(name, fn, run_in=run_in)
            return fn

        return decorate

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event, data)`` on claimed, finished, lost, ping, ... (tests, metrics)."""
        self._listeners.append(listener)

    def _emit(self, event: str, data: dict[str, Any]) -> None:
        for listener in self._listeners:
            listener(event, data)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def running_count(self) -> int:
        return len(self._running)

    def structure_sizes(self) -> dict[str, int]:
        """The entries of each in-memory structure of this consumer, by name (docs/design.md,
        "Steady state", says what each holds and its bound): what the steady-state benchmark and
        its test watch. Its store's own are ``MemoryDriver.structure_sizes``."""
        sizes = {
            "running": len(self._running),
            "ran_fanout": len(self._ran_fanout),
            "finishes_pending": len(self._pending),
            "listeners": len(self._listeners),
            "event_buffer": len(self.events) if self.events is not None else 0,
            "children_requested": self.child_sync.requested if self.child_sync is not None else 0,
        }
        if self.discovery is not None:
            sizes.update(self.discovery.structure_sizes())
        sizes.update(self.limiter.structure_sizes())
        return sizes

    @property
    def state(self) -> str:
        """``"created"`` (not started), ``"running"``, ``"stopping"`` or ``"stopped"``; see
        ``stop_reason`` for why it stopped: ``"requested"`` (``stop()``), ``"remote"`` (a stop
        requested through the database, see ``mscheduler.Operations.request_worker_stop``) or
        ``"error: ..."`` (a configuration error or a side task that died; ``error`` holds it)."""
        if self._stopped.is_set():
            return "stopped"
        if self._stopping:
            return "stopping"
        return "running" if self._side else "created"

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._side:
            raise InvalidInput("the consumer is already started")
        if not self._handlers:
            raise InvalidInput("register at least one handler before starting")
        await self.driver.prepare()  # the indexes are ``mscheduler setup``'s: checked, not built
        await self.clock.sync(self.driver.server_time)
        now = self.clock.now()
        names = sorted(self._handlers)
        schemas = [(n, text) for n in names if (text := params_schema_text(self._handlers[n].model))]
        await self.driver.register_worker(
            WorkerInfo(
                self.worker_id, self.host, self.pid, names, self.concurrency, now, self.groups, schemas
            )
        )
        self.child_sync = ChildSync(self.driver, clock=self.clock, interval=self.children_interval)
        self.discovery = Discovery(
            self.driver,
            self.clock,
            worker_id=self.worker_id,
            names=names,
            poll_interval=self.poll_interval,
            stream_poll_interval=self.stream_poll_interval,
            batch_size=min(max(self.concurrency * 4, 100), self.wakeup_queue_size),
            max_size=self.wakeup_queue_size,
            on_event=self._emit,
            on_stop=self._stop_requested,
            groups=self.groups,
            excluded=self._excluded_from_claims,
            fairness=self.fairness,
        )
        try:
            await self.discovery.poll_once()
        except StorageError as exc:
            if not exc.transient:
                raise
            log.warning("first poll failed (%s); the poller tries again", exc)
        if getattr(self.driver, "record_events", False):
            self.events = EventRecorder(self.driver, self.clock)
        for name, coro in (
            ("watcher", self.discovery.run_watcher()),
            ("poller", self.discovery.run_poller()),
            ("claimer", self._run_claimer()),
            ("pinger", self._run_pinger()),
            ("finisher", self._run_finisher()),
            ("heartbeat", self._run_heartbeat()),
            *((("events", self._run_events()),) if self.events is not None else ()),
            *((("planner", self._run_planner()),) if self.planner_enabled else ()),
            ("children", self.child_sync.run()),
            *((("retention", self._run_retention()),) if self.retention is not None else ()),
        ):
            task = asyncio.create_task(coro, name=f"mscheduler:{self.worker_id}:{name}")
            task.add_done_callback(self._side_task_done)
            self._side[name] = task
        self._emit("started", {"worker_id": self.worker_id})

    def _side_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        exc = task.exception()
        if task.get_name().endswith(":watcher") and exc is None:
            return  # change streams unsupported: polling carries on
        self.error = exc or ConsumerStopped(f"side task {task.get_name()} ended")
        self.stop_reason = f"error: {self.error}"
        log.error(
            "consumer %s: %s died: %r; stopping",
            self.worker_id,
            task.get_name(),
            exc,
            extra={"worker_id": self.worker_id, "side_task": task.get_name(), "reason": str(self.error)},
        )
        self._stop_task = asyncio.ensure_future(self.stop(grace=0))

    async def run(self) -> None:
        """Start (if needed) and wait until stopped; raises ConsumerStopped if a side task died."""
        if not self._side:
            await self.start()
        await self._stopped.wait()
        if self.error is not None:
            raise ConsumerStopped(f"consumer {self.worker_id} stopped: {self.error!r}") from self.error

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self, grace: float | None = None) -> None:
        """Stop claiming, let handlers finish within ``grace`` seconds, then cancel and release.

        Idempotent; a second call with ``grace=0`` while a graceful stop waits cancels at once.
        Released attempts do not count against the retry budget.
        """
        grace = self.grace_period if grace is None else grace
        if self.stop_reason is None:
            self.stop_reason = "requested"
        if self._shutdown_task is None:
            self._stopping = True
            # A task of its own, shielded: a caller that is cancelled (say by a timeout) while
            # waiting does not leave the consumer half stopped.
            self._shutdown_task = asyncio.create_task(
                self._shutdown(grace), name=f"mscheduler:{self.worker_id}:shutdown"
            )
        elif grace == 0:
            self._hurry.set()
            self._cancel_all("released")
        await asyncio.shield(self._shutdown_task)

    async def _shutdown(self, grace: float) -> None:
        try:
            await self._shutdown_steps(grace)
        finally:
            self._stopped.set()

    async def _shutdown_steps(self, grace: float) -> None:
        self._emit("stopping", {"grace": grace})
        if not self._side:
            return
        deadline = self.clock.monotonic() + grace
        self._side["claimer"].cancel()
        if self.planner is not None:
            self.planner.stop()
        if self.retention_service is not None:
            self.retention_service.stop()
        await self._release_claim_in_flight(deadline)
        handler_tasks = [r.task for r in self._running.values() if r.task is not None and not r.task.done()]
        if handler_tasks:
            await self._wait_grace(handler_tasks, deadline)
        self._cancel_all("released")
        remaining = [r.task for r in self._running.values() if r.task is not None and not r.task.done()]
        if remaining:
            await asyncio.wait(remaining)
        self.limiter.give_back_reserve()
        self.pools.close()  # every attempt is settled: stuck threads run on, processes end
        await self._drain_finisher()
        await self._flush_child_sync()
        for name, task in self._side.items():
            if name != "claimer" and not task.done():
                task.cancel()
        await asyncio.gather(*self._side.values(), return_exceptions=True)
        await self._flush_events()
        try:
            await self.driver.unregister_worker(self.worker_id, self.clock.now())
        except MSchedulerError as exc:
            log.warning("could not unregister worker %s: %s", self.worker_id, exc)
        self._emit("stopped", {"worker_id": self.worker_id})

    async def _release_claim_in_flight(self, deadline: float) -> None:
        """Let a claim cut off by stop() land (within the grace period) and give back the tasks
        it took, so they are not left with orphan leases that would cost a retry each."""
        call, self._claim_call = self._claim_call, None
        if call is None:
            return
        if not call.done():
            await self._wait_grace([call], deadline)
        if not call.done():
            call.cancel()  # the store does not answer in time: an orphan lease may be left
            return
        if call.cancelled() or call.exception() is not None:
            return
        for task in call.result():
            if task.key in self._running and self._running[task.key].claimed.attempt == task.attempt:
                continue  # started before the claimer was cancelled: the grace period covers it
            error = {
                "type": "Cancelled",
                "message": "attempt released: the worker stopped",
                "traceback": None,
            }
            params = FinishParams(
                task.key,
                self.worker_id,
                task.attempt,
                self.clock.now(),
                AttemptStatus.RELEASED.value,
                None,
                error,
            )
            try:
                await self._submit(params, task.slot)
            except MSchedulerError as exc:
                log.warning("could not release %s: %s", task.key, exc)

    async def _wait_grace(self, waited: list[Any], deadline: float) -> None:
        """Wait until ``waited`` are done, the grace period ends on the consumer's clock
        or a second ``stop(grace=0)`` says to hurry."""
        remaining = deadline - self.clock.monotonic()
        if remaining <= 0 or self._hurry.is_set():
            return
        all_done = asyncio.ensure_future(asyncio.wait(waited))
        timer = asyncio.ensure_future(self.clock.sleep(remaining))
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait({all_done, timer, hurry}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            all_done.cancel()
            timer.cancel()
            hurry.cancel()

    def _cancel_all(self, reason: str) -> None:
        for running in self._running.values():
            running.cancel(reason)

    # -- events ---------------------------------------------------------------------------------

    @staticmethod
    def _fails_for_good(
        running: RunningAttempt, stat: str, error: dict[str, Any] | None, final: bool = False
    ) -> bool:
        """Does this outcome end the task as failed (rejected, Fail, or the budget used)?"""
        return fails_for_good(running.option, running.claimed.fail_cnt, stat, error, final)

    def _record_event(
        self, running: RunningAttempt, kind: EventKind, detail: dict[str, Any] | None = None
    ) -> None:
        assert self.events is not None
        claimed = running.claimed
        self.events.attempt_event(
            kind,
            claimed.key,
            claimed.name,
            claimed.attempt,
            claimed.attempt_no,
            self.worker_id,
            detail,
            claimed.generation,
        )

    async def _run_events(self) -> None:
        assert self.events is not None
        await self.events.run()

    async def _flush_events(self) -> None:
        """At stop: write what is buffered (once; what the store refuses now is lost)."""
        if self.events is None or not len(self.events):
            return
        try:
            if not await self.events.flush():
                log.warning("%d events not written at stop (the store did not take them)", len(self.events))
        except MSchedulerError as exc:
            log.warning("could not write events at stop: %s", exc)

    # -- child tasks ----------------------------------------------------------------------------

    def _sync_parents_of(self, keys: Iterable[str]) -> None:
        """A child's claim or finish was accepted: its parent is synced next (the follow-up in
        another document; the reconciler repairs it if this consumer dies first)."""
        parents = [r.claimed.parent for key in keys if (r := self._running.get(key)) and r.claimed.parent]
        if parents and self.child_sync is not None:
            self.child_sync.request(parents)

    async def _flush_child_sync(self) -> None:
        if self.child_sync is None:
            return
        self.child_sync.stop()
        try:
            await self.child_sync.flush()
        except MSchedulerError as exc:  # the reconciler of another consumer repairs it
            log.warning("could not sync the parents of child tasks while stopping: %s", exc)

    # -- planner --------------------------------------------------------------------------------

    async def _run_planner(self) -> None:
        self.planner = Planner(
            self.driver, clock=self.clock, interval=self.planner_interval, on_created=self._planned
        )
        await self.planner.run()

    def _planned(self, tasks: Sequence[NewTask]) -> None:
        """Runs this consumer's planner created: their due times are queued here, as a retry's
        are (a store without change streams would only tell the next poll)."""
        if self.discovery is None:
            return
        for task in tasks:
            run_at = task.option.get("run_at")
            if (
                task.name in self._handlers
                and isinstance(run_at, datetime)
                and allowed(task.option, self.worker_id, self.groups)
            ):
                self.discovery.due_at(task.key, run_at)

    async def _run_retention(self) -> None:
        self.retention_service = RetentionService(
            self.driver, self.retention, clock=self.clock, interval=self.retention_interval
        )
        await self.retention_service.run()

    # -- storage errors -------------------------------------------------------------------------

    async def _storage_trouble(self, what: str, exc: StorageError, *, back_off: bool = True) -> None:
        """What a side task does about a storage error it met: a configuration error (auth, an
        unknown write concern) stops the consumer (raised, so the side task dies loudly); any
        other error is logged and the side task carries on, after a pause for errors that no
        retry of the driver fixed. Errors about one task's document never get here: the driver
        records them on that task."""
        fields = {"worker_id": self.worker_id, "operation": what, "error": str(exc)}
        if exc.config:
            raise exc
        if exc.transient:
            log.warning("%s failed (%s); trying again", what, exc, extra=fields)
            return
        log.error("%s failed (%s); trying again in %.0f s", what, exc, ERROR_BACKOFF, extra=fields)
        if back_off:
            await self.clock.sleep(ERROR_BACKOFF)

    # -- heartbeat --------------------------------------------------------------------------------

    async def _run_heartbeat(self) -> None:
        beats = 0
        while True:
            await self.clock.sleep(self.heartbeat_interval)
            beats += 1
            try:
                stop = await self.driver.heartbeat_worker(
                    self.worker_id, self.clock.now(), len(self._running)
                )
                if beats % 12 == 0:
                    await self.clock.sync(self.driver.server_time)
            except StorageError as exc:
                await self._storage_trouble("heartbeat", exc, back_off=False)
                continue
            if stop:
                if self.stop_reason is None:
                    self.stop_reason = "remote"
                log.info(
                    "consumer %s: stop requested through the database",
                    self.worker_id,
                    extra={"worker_id": self.worker_id},
                )
                self._emit("remote_stop", {"worker_id": self.worker_id})
                self._stop_task = asyncio.ensure_future(self.stop())
                # Stay alive until stop() cancels us: a side task that ends is a failure.
                await self._stopped.wait()
                return
