"""How a registered handler is called: an ``async def`` on the event loop, a plain
function in the consumer's thread pool, CPU-bound work in its process pool.

``inspect_handler`` checks what ``Consumer.register`` was given — a function, a
``functools.partial``, a callable object or a bound method, ``async`` or not — and returns a
``Registered`` whose ``fn`` the runner awaits the same way for every kind: the runner's lease
pings, run timeout, cancellation and outcome rules apply unchanged.

A thread cannot be killed, and neither can one job of a process pool without breaking the pool:
when an attempt running in a thread or a process is cancelled (an operator's cancel or pause, a
lost or revoked lease, its run timeout, a stop past the grace period) the attempt is settled at
once, without waiting; the context's ``cancelled`` flag is set for the handler to poll and stop
early, its later checkpoints raise ``LeaseLost``, its progress is dropped, and whatever it
returns or raises is dropped. Its thread or process stays busy until it returns. The thread
pool's threads are daemon threads (one that never returns does not keep the process from
exiting); the process pool's processes are terminated when the consumer stops.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import multiprocessing
import os
import pickle
import queue
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel

from mscheduler.domain.exceptions import InvalidInput, LeaseLost
from mscheduler.domain.model import TaskOption
from mscheduler.domain.params_schema import SCHEMA_MAX_BYTES
from mscheduler.runtime.consumer.reports import checked_progress

log = logging.getLogger("mscheduler.consumer")

Handler = Callable[..., Any]
RunIn = Literal["loop", "thread", "process"]
RUN_IN = ("loop", "thread", "process")


@dataclass(slots=True)
class Registered:
    """A handler as the runner calls it: ``await fn(*args)`` whatever its kind."""

    fn: Callable[..., Awaitable[Any]]
    model: type[BaseModel] | None
    wants_params: bool
    wants_context: bool
    run_in: RunIn = "loop"
    target: Handler | None = None  # what the user registered


# -- looking at what was registered ----------------------------------------------------------------


def params_schema_text(model: type[BaseModel] | None) -> str | None:
    """The JSON schema of a handler's params model as compact JSON text: what the consumer
    publishes with its registration, so that a send over the API or the CLI is checked at the
    door (``mscheduler.domain.params_schema``). None without a model, for a model pydantic
    cannot describe, or for a schema over ``SCHEMA_MAX_BYTES`` (such sends are not checked)."""
    if model is None:
        return None
    try:
        text = json.dumps(model.model_json_schema(), separators=(",", ":"))  # fields in model order
    except Exception:  # a field type without a JSON schema: the handler still validates
        log.debug("no JSON schema for %s", model.__qualname__, exc_info=True)
        return None
    return text if len(text.encode()) <= SCHEMA_MAX_BYTES else None


def _unwrapped(fn: Any) -> Any:
    """The function behind partials (whose own annotations say what the params are)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def is_async(fn: Any) -> bool:
    """An ``async def`` function, a partial of one, or an object whose ``__call__`` is one."""
    inner = _unwrapped(fn)
    if inspect.iscoroutinefunction(inner):
        return True
    call = getattr(type(inner), "__call__", None)  # noqa: B004 (an object's __call__, not callable())
    return not inspect.isroutine(inner) and not inspect.isclass(inner) and inspect.iscoroutinefunction(call)


def _hints(fn: Any) -> dict[str, Any]:
    """The handler's resolved annotations (of its function, or of its class's ``__call__``)."""
    inner = _unwrapped(fn)
    target = inner if inspect.isroutine(inner) else getattr(type(inner), "__call__", inner)  # noqa: B004
    try:
        return get_type_hints(target)
    except Exception:  # unresolvable string annotations: params are passed as stored
        return {}


def _describe(fn: Any) -> str:
    return getattr(_unwrapped(fn), "__qualname__", None) or repr(fn)


def inspect_handler(name: str, fn: Any, run_in: RunIn | None, pools: HandlerPools) -> Registered:
    """What ``Consumer.register(name, fn, run_in=...)`` registers, or ``InvalidInput`` naming
    ``name`` and the handler. ``run_in`` None: ``async`` handlers on the loop, others in a thread."""
    if not callable(fn):
        raise InvalidInput(f"handler for {name!r}: {fn!r} is neither an async function nor a callable")
    asynchronous = is_async(fn)
    if run_in is None:
        run_in = "loop" if asynchronous else "thread"
    if run_in not in RUN_IN:
        raise InvalidInput(f"handler for {name!r}: run_in must be one of {', '.join(RUN_IN)}, got {run_in!r}")
    if asynchronous and run_in != "loop":
        raise InvalidInput(
            f"handler for {name!r}: {_describe(fn)} is async: it runs on the event loop, not in a {run_in}"
        )
    if not asynchronous and run_in == "loop":
        raise InvalidInput(
            f"handler for {name!r}: {_describe(fn)} is not async: run it in a thread or a process"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"handler for {name!r}: cannot read the signature of {fn!r} ({exc})") from exc
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required_keywords = [
        p.name
        for p in signature.parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if len(required) > 2 or required_keywords:
        raise InvalidInput(
            f"handler for {name!r}: {_describe(fn)} must take (params) or (params, ctx); "
            f"it needs {', '.join([p.name for p in required] + required_keywords)}"
        )
    wants = min(len(positional), 2)
    model = None
    if wants:
        hint = _hints(fn).get(positional[0].name)
        if inspect.isclass(hint) and issubclass(hint, BaseModel):
            model = hint
    if run_in == "process":
        try:
            pickle.dumps(fn)
        except Exception as exc:
            raise InvalidInput(
                f"handler for {name!r}: run_in='process' needs a callable that pickles (a module-level "
                f"function, a partial of one, an instance of a module-level class): {exc}"
            ) from exc
    if run_in == "loop":
        call: Callable[..., Awaitable[Any]] = fn
    elif run_in == "thread":
        call = _ThreadCall(fn, wants == 2, pools)
    else:
        call = _ProcessCall(fn, wants == 2, pools)
    return Registered(call, model, wants >= 1, wants == 2, run_in, fn)


# -- the pools ---------------------------------------------------------------------------------------


class DaemonThreadPool(Executor):
    """A fixed number of daemon threads running submitted calls in order. Daemon threads, unlike
    ``ThreadPoolExecutor``'s, do not hold the process at exit: a handler stuck in a thread (it
    cannot be killed) must not keep a stopped worker from ending."""

    def __init__(self, size: int, name: str) -> None:
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._work.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class HandlerPools:
    """The consumer's thread pool (plain handlers) and process pool (``run_in="process"``),
    each made when first needed and closed when the consumer stops.

    :param threads: threads for plain handlers (at most this many run at once; more wait).
    :param processes: processes for ``run_in="process"`` handlers.
    :param name: names the threads (the worker id).
    """

    def __init__(self, threads: int, processes: int, name: str) -> None:
        self.thread_count = threads
        self.process_count = processes
        self.name = name
        self._threads: DaemonThreadPool | None = None
        self._processes: ProcessPoolExecutor | None = None
        self._manager: Any = None
        self._manager_lock = threading.Lock()  # ``manager`` is called from threads

    def threads(self) -> DaemonThreadPool:
        if self._threads is None:
            self._threads = DaemonThreadPool(self.thread_count, f"mscheduler-{self.name}")
        return self._threads

    def processes(self) -> ProcessPoolExecutor:
        # spawn: a fork of a process running an event loop and threads may deadlock
        if self._processes is None:
            self._processes = ProcessPoolExecutor(self.process_count, mp_context=_SPAWN)
        return self._processes

    def manager(self) -> Any:
        """A multiprocessing manager: the per-attempt flags and queues a process's context uses
        (started in a thread by the first attempt that needs one: starting it blocks)."""
        with self._manager_lock:
            if self._manager is None:
                self._manager = _SPAWN.Manager()
            return self._manager

    def close(self) -> None:
        """At the consumer's stop: the threads end when their handlers return; the processes are
        terminated (their attempts were settled already)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None
        if self._processes is not None:
            # the pool's own list of its processes (ProcessPoolExecutor has no public one before 3.14)
            processes = list((getattr(self._processes, "_processes", None) or {}).values())
            manager_thread = getattr(self._processes, "_executor_manager_thread", None)
            self._processes.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                if process.is_alive():
                    process.terminate()
            # Its manager thread closes the pool's wake-up pipe as it ends; were it still ending
            # at interpreter exit, CPython's exit hook (before 3.11.8 / 3.12.1) could write to
            # that pipe as it closed: "OSError: Bad file descriptor" after a clean stop (seen
            # once in `mscheduler dev`'s test). The processes are terminated: it ends at once.
            if manager_thread is not None:
                manager_thread.join(timeout=5)
            self._processes = None
        if self._manager is not None:
            self._manager.shutdown()
            self._manager = None


_SPAWN = multiprocessing.get_context("spawn")


def default_process_count(concurrency: int) -> int:
    return max(1, min(concurrency, os.cpu_count() or 1))


# -- contexts for handlers off the loop ---------------------------------------------------------------


class SyncTaskContext:
    """A ``TaskContext`` for a plain (non-async) handler, usable from its thread: the same fields,
    ``checkpoint(data)`` that blocks until stored (raises ``LeaseLost`` / ``InvalidInput`` as the
    async one does), ``progress(fraction, message)``, and ``cancelled``: True once the attempt
    was given up (cancelled, paused, lease lost or revoked, run timeout, stop): the attempt is
    settled already and nothing the handler does any more is kept, so it should return."""

    def __init__(self, ctx: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self.key: str = ctx.key
        self.name: str = ctx.name
        self.attempt: str = ctx.attempt
        self.attempt_no: int = ctx.attempt_no
        self.worker_id: str = ctx.worker_id
        self.option: TaskOption = ctx.option
        self.checkpoint_data: Any = ctx.checkpoint_data
        self.results: dict[str, Any] = ctx.results

    def __repr__(self) -> str:
        return f"SyncTaskContext(key={self.key!r}, name={self.name!r}, attempt_no={self.attempt_no})"

    @property
    def cancelled(self) -> bool:
        return bool(self._ctx.cancelled)

    def checkpoint(self, data: Any) -> None:
        if self.cancelled:
            raise LeaseLost("the checkpoint was not saved: the attempt was given up")
        try:
            on_the_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_the_loop = False
        if on_the_loop:  # it would wait for the loop it blocks
            raise InvalidInput("SyncTaskContext.checkpoint blocks: call it from the handler's thread")
        asyncio.run_coroutine_threadsafe(self._ctx.checkpoint(data), self._loop).result()

    def progress(self, fraction: float, message: str | None = None) -> None:
        checked_progress(fraction, message)  # refused here, in the handler's thread
        self._loop.call_soon_threadsafe(self._ctx.progress, fraction, message)


@dataclass
class ProcessTaskContext:
    """A handler's context in a process of the pool (``run_in="process"``): the task's fields,
    ``cancelled``, ``progress`` and ``checkpoint`` (blocking), relayed to the consumer through a
    multiprocessing manager. Pickled into the process with the params."""

    key: str
    name: str
    attempt: str
    attempt_no: int
    worker_id: str
    option: TaskOption
    checkpoint_data: Any
    _cancel: Any = field(repr=False)
    _requests: Any = field(repr=False)
    _replies: Any = field(repr=False)
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def cancelled(self) -> bool:
        return bool(self._cancel.is_set())

    def checkpoint(self, data: Any) -> None:
        if self.cancelled:
            raise LeaseLost("the checkpoint was not saved: the attempt was given up")
        if isinstance(data, BaseModel):
            data = data.model_dump(mode="json")
        self._requests.put(("checkpoint", data))
        answer = self._replies.get()
        if answer[0] == "ok":
            return
        raise (LeaseLost if answer[1] == "LeaseLost" else InvalidInput)(answer[2])

    def progress(self, fraction: float, message: str | None = None) -> None:
        checked_progress(fraction, message)
        if not self.cancelled:
            self._requests.put(("progress", fraction, message))


def _in_process(fn: Handler, args: tuple[Any, ...]) -> Any:
    """What a process of the pool runs (module level: it is pickled by name)."""
    return fn(*args)


def _settled(ctx: Any) -> None:
    if ctx is not None:
        ctx._give_up("given up")


def _not_a_coroutine(result: Any, fn: Handler) -> Any:
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"{_describe(fn)} returned an awaitable: declare it with async def")
    return result


class _ThreadCall:
    """Runs a plain handler in the thread pool; a cancel settles at once (see the module doc)."""

    def __init__(self, fn: Handler, wants_context: bool, pools: HandlerPools) -> None:
        self.fn = fn
        self.wants_context = wants_context
        self.pools = pools

    async def __call__(self, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        ctx = args[-1] if self.wants_context else None
        if ctx is not None:
            args = (*args[:-1], SyncTaskContext(ctx, loop))
        future = loop.run_in_executor(self.pools.threads(), functools.partial(self.fn, *args))
        try:
            result = await future
        except asyncio.CancelledError:
            _settled(ctx)  # the thread runs on: it polls ctx.cancelled; its outcome is dropped
            raise
        return _not_a_coroutine(result, self.fn)


class _ProcessCall:
    """Runs a handler in the process pool: params and result pickled; the context's flag,
    progress and checkpoints go through the pool's manager."""

    def __init__(self, fn: Handler, wants_context: bool, pools: HandlerPools) -> None:
        self.fn = fn
        self.wants_context = wants_context
        self.pools = pools

    async def __call__(self, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        ctx = args[-1] if self.wants_context else None
        remote: ProcessTaskContext | None = None
        relay: asyncio.Task[None] | None = None
        if ctx is not None:
            manager = await asyncio.to_thread(self.pools.manager)  # started once, in a thread
            remote = ProcessTaskContext(
                ctx.key,
                ctx.name,
                ctx.attempt,
                ctx.attempt_no,
                ctx.worker_id,
                ctx.option,
                ctx.checkpoint_data,
                manager.Event(),
                manager.Queue(),
                manager.Queue(),
                ctx.results,
            )
            args = (*args[:-1], remote)
            relay = asyncio.ensure_future(_relay(ctx, remote))
        future = loop.run_in_executor(self.pools.processes(), _in_process, self.fn, args)
        try:
            return await future
        except asyncio.CancelledError:
            _settled(ctx)
            if remote is not None:
                remote._cancel.set()  # the process polls ctx.cancelled
            raise
        finally:
            if remote is not None and relay is not None:
                try:
                    remote._requests.put(None)  # the relay ends once it served what came before
                except Exception:  # the manager is gone (the consumer stopped): so is the relay
                    relay.cancel()
                relay.add_done_callback(lambda f: f.cancelled() or f.exception())


async def _relay(ctx: Any, remote: ProcessTaskContext) -> None:
    """Hand what the process reports to the attempt's context until the attempt ends: a daemon
    thread waits on the manager's queue (a blocking call) and passes each item to the loop."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[Any] = asyncio.Queue()

    def pump() -> None:
        while True:
            try:
                item = remote._requests.get()
            except Exception:  # the manager is gone: the consumer stopped
                item = None
            loop.call_soon_threadsafe(items.put_nowait, item)
            if item is None:
                return

    threading.Thread(target=pump, name=f"mscheduler-relay-{ctx.key}", daemon=True).start()
    while True:
        item = await items.get()
        if item is None:
            return
        if item[0] == "progress":
            ctx.progress(item[1], item[2])
            continue
        try:
            await ctx.checkpoint(item[1])
            answer: tuple[str, ...] = ("ok",)
        except (LeaseLost, InvalidInput) as exc:
            answer = ("error", type(exc).__name__, str(exc))
        await asyncio.to_thread(remote._replies.put, answer)
