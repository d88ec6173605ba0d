"""Plain (non-async) handlers in the consumer's thread pool and CPU-bound ones in its process pool
(SPEC G8): the result, errors and verdicts are recorded as for an async handler; the lease is
pinged while the thread works; the context works from the thread (progress, checkpoint); a cancel
settles the attempt at once and sets ``ctx.cancelled`` for the thread to see; partials, callable
objects and bound methods are accepted; what cannot run is refused at ``register``."""

from __future__ import annotations

import asyncio
import functools
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from mscheduler import (
    Consumer,
    Fail,
    InvalidInput,
    LeaseLost,
    MemoryDriver,
    Operations,
    Retry,
    SyncTaskContext,
    Task,
    TaskContext,
    TaskOption,
    TaskStatus,
)
from tests.consumer import process_handlers
from tests.consumer.support import Harness, settle

OPTION = TaskOption(ping_interval=timedelta(seconds=2), worker_timeout=timedelta(seconds=6))
WAIT = 20.0  # seconds a test waits for a thread at most (a safety net, never a delay)


async def until(event: threading.Event) -> None:
    """Wait (off the loop) until a handler's thread sets ``event``."""
    assert await asyncio.to_thread(event.wait, WAIT), "the handler's thread did not get there"


async def test_a_plain_function_runs_in_a_thread_with_a_working_context(harness: Harness) -> None:
    seen: dict[str, Any] = {}

    def resize(params: dict[str, int], ctx: SyncTaskContext) -> dict[str, int]:
        seen["thread"] = threading.current_thread().name
        ctx.progress(0.5, "half")
        ctx.checkpoint({"rows": params["w"]})  # blocks until the ping stored it
        return {"area": params["w"] * params["h"]}

    consumer = harness.consumer("w1", {"resize": resize})
    await harness.start(consumer)
    await harness.publisher.send(Task("img-1", "resize", {"w": 3, "h": 4}, option=OPTION))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    info = await harness.get("img-1")
    assert info.status is TaskStatus.SUCCEEDED and info.results == [{"area": 12}]
    assert seen["thread"].startswith("mscheduler-w1") and seen["thread"] != threading.main_thread().name
    assert info.checkpoint is not None and info.checkpoint.data == {"rows": 3}
    assert info.progress is not None and (info.progress.fraction, info.progress.message) == (0.5, "half")


async def test_the_loop_runs_on_and_the_lease_is_pinged_while_the_thread_blocks(harness: Harness) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(params: Any) -> str:
        entered.set()
        release.wait(WAIT)
        return "slow done"

    async def quick(params: Any) -> str:
        return "quick done"

    consumer = harness.consumer("w1", {"slow": slow, "quick": quick}, concurrency=2)
    await harness.start(consumer)
    await harness.publisher.send(Task("s", "slow", {}, option=OPTION))
    await harness.discover()
    await until(entered)
    await harness.publisher.send(Task("q", "quick", {}, option=OPTION))
    await harness.discover()
    await harness.recorder.wait("finished", 1)  # the async handler ran while the thread blocked
    assert (await harness.get("q")).status is TaskStatus.SUCCEEDED
    for _ in range(6):  # 12 s on a 6 s lease: only pings keep it
        await harness.advance(2.0)
    info = await harness.get("s")
    assert info.status is TaskStatus.RUNNING and harness.recorder.counts["ping"] >= 5
    release.set()
    await harness.recorder.wait("finished", 2)
    info = await harness.get("s")
    assert info.status is TaskStatus.SUCCEEDED and info.attempts == 1 and info.results == ["slow done"]


async def test_a_cancel_settles_at_once_and_the_thread_sees_the_flag(harness: Harness) -> None:
    entered, release, saw = threading.Event(), threading.Event(), threading.Event()
    after: dict[str, Any] = {}

    def stuck(params: Any, ctx: SyncTaskContext) -> str:
        entered.set()
        release.wait(WAIT)
        after["cancelled"] = ctx.cancelled
        try:
            ctx.checkpoint({"late": True})
        except LeaseLost as exc:
            after["checkpoint"] = str(exc)
        saw.set()
        return "dropped"

    consumer = harness.consumer("w1", {"stuck": stuck})
    await harness.start(consumer)
    await harness.publisher.send(Task("c", "stuck", {}, option=OPTION))
    await harness.discover()
    await until(entered)
    await Operations(harness.driver, clock=harness.clock).cancel("c", "enough")
    await harness.advance(2.0)  # the next ping (or the change stream) tells the consumer
    await harness.recorder.wait("finished", 1)  # settled while the thread still blocks
    assert consumer.running_count == 0
    release.set()
    await until(saw)
    assert after["cancelled"] is True and "not saved" in after["checkpoint"]
    await settle()
    info = await harness.get("c")
    assert info.status is TaskStatus.CANCELLED and info.results == [] and info.checkpoint is None


async def test_a_run_timeout_settles_a_plain_handler_and_the_thread_sees_the_flag(harness: Harness) -> None:
    entered, release, saw = threading.Event(), threading.Event(), threading.Event()
    after: dict[str, Any] = {}

    def stuck(params: Any, ctx: SyncTaskContext) -> str:
        entered.set()
        release.wait(WAIT)
        after["cancelled"] = ctx.cancelled
        saw.set()
        return "too late"

    consumer = harness.consumer("w1", {"stuck": stuck})
    await harness.start(consumer)
    option = OPTION.model_copy(update={"run_timeout": timedelta(seconds=10), "max_unexpected_retries": 0})
    await harness.publisher.send(Task("rt", "stuck", {}, option=option))
    await harness.discover()
    await until(entered)
    for _ in range(4):  # 8 s of the consumer's clock: pings keep the lease, the timeout not due
        await harness.advance(2.0)
    assert not harness.recorder.counts["finished"]
    await harness.advance(2.0)  # 10 s: the run timeout (on the consumer's clock) gives it up
    await harness.recorder.wait("finished", 1)  # settled while the thread still blocks
    assert consumer.running_count == 0
    info = await harness.get("rt")
    [attempt] = info.worker_states
    assert attempt.error is not None and attempt.error.type == "RunTimedOut"
    assert info.status is TaskStatus.FAILED and info.results == []
    release.set()
    await until(saw)
    assert after["cancelled"] is True  # the thread was told to give up
    await settle()
    assert (await harness.get("rt")).results == []  # its late result is not recorded


class Boom(Exception):
    pass


async def test_a_plain_handler_that_raises_is_recorded_as_an_async_one(harness: Harness) -> None:
    def sync_boom(params: Any) -> None:
        raise Boom("broken in a thread")

    async def async_boom(params: Any) -> None:
        raise Boom("broken in a thread")

    def sync_retry(params: Any) -> None:
        raise Retry(60, "later")

    def sync_fail(params: Any) -> None:
        raise Fail("never")

    handlers = {"sb": sync_boom, "ab": async_boom, "sr": sync_retry, "sf": sync_fail}
    consumer = harness.consumer("w1", handlers, concurrency=4)
    await harness.start(consumer)
    for name in handlers:
        await harness.publisher.send(Task(name, name, {}, option=OPTION))
        await harness.discover()
    await harness.recorder.wait("finished", 4)
    sync_info, async_info = await harness.get("sb"), await harness.get("ab")
    for info in (sync_info, async_info):
        assert info.status is TaskStatus.PENDING and info.fail_cnt == 1
    sync_error, async_error = sync_info.worker_states[0].error, async_info.worker_states[0].error
    assert sync_error is not None and async_error is not None
    assert (
        (sync_error.type, sync_error.message)
        == (async_error.type, async_error.message)
        == (
            "Boom",
            "broken in a thread",
        )
    )
    assert "sync_boom" in (sync_error.traceback or "")
    retried = await harness.get("sr")
    assert retried.fail_cnt == 1 and retried.next_due == harness.clock.now() + timedelta(seconds=60)
    assert (await harness.get("sf")).status is TaskStatus.FAILED


class Doubler:
    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, params: dict[str, int]) -> int:
        return params["n"] * self.factor

    def method(self, params: dict[str, int]) -> int:
        return params["n"] + self.factor

    async def async_method(self, params: dict[str, int]) -> int:
        return params["n"] - self.factor


class AsyncCallable:
    async def __call__(self, params: dict[str, int], ctx: TaskContext) -> str:
        return f"{ctx.name}:{params['n']}"


def scaled(factor: int, params: dict[str, int]) -> int:
    return params["n"] * factor


async def scaled_async(factor: int, params: dict[str, int], ctx: TaskContext) -> str:
    return f"{ctx.key}:{params['n'] * factor}"


async def test_partials_callable_objects_and_bound_methods(harness: Harness) -> None:
    obj = Doubler(3)
    handlers: dict[str, Any] = {
        "partial": functools.partial(scaled, 10),
        "partial_async": functools.partial(scaled_async, 2),
        "callable": obj,
        "callable_async": AsyncCallable(),
        "method": obj.method,
        "method_async": obj.async_method,
    }
    consumer = harness.consumer("w1", handlers, concurrency=6)
    await harness.start(consumer)
    await harness.publisher.send_many([Task(n, n, {"n": 7}, option=OPTION) for n in handlers])
    await harness.discover()
    await harness.recorder.wait("finished", len(handlers))
    results = {n: (await harness.get(n)).results for n in handlers}
    assert results == {
        "partial": [70],
        "partial_async": ["partial_async:14"],
        "callable": [21],
        "callable_async": ["callable_async:7"],
        "method": [10],
        "method_async": [4],
    }
    assert {n: r.run_in for n, r in consumer._handlers.items()} == {
        "partial": "thread",
        "partial_async": "loop",
        "callable": "thread",
        "callable_async": "loop",
        "method": "thread",
        "method_async": "loop",
    }


@pytest.mark.parametrize(
    ("handler", "run_in", "says"),
    [
        (42, None, "handler for 'job': 42 is neither an async function nor a callable"),
        ("not a function", None, "handler for 'job': 'not a function' is neither"),
        (lambda params: params, "process", "needs a callable that pickles"),
        (scaled_async, "thread", "is async: it runs on the event loop"),
        (scaled, "loop", "is not async"),
        (scaled, "gpu", "run_in must be one of loop, thread, process"),
        (lambda a, b, c: None, None, "must take (params) or (params, ctx)"),
    ],
)
def test_register_refuses_what_cannot_run(handler: Any, run_in: Any, says: str) -> None:
    consumer = Consumer(MemoryDriver())
    with pytest.raises(InvalidInput) as refused:
        consumer.register("job", handler, run_in=run_in)
    assert says in str(refused.value)
    assert consumer._handlers == {}


async def test_the_thread_pool_size_bounds_plain_handlers(harness: Harness) -> None:
    first, release = threading.Event(), threading.Event()
    entered: list[str] = []

    def work(params: dict[str, str]) -> str:
        entered.append(params["k"])
        first.set()
        release.wait(WAIT)
        return params["k"]

    consumer = harness.consumer("w1", {"work": work}, concurrency=3, thread_pool_size=1)
    await harness.start(consumer)
    await harness.publisher.send_many([Task(k, "work", {"k": k}, option=OPTION) for k in ("a", "b")])
    await harness.discover()
    await until(first)
    await harness.recorder.wait("claimed", 2)
    assert entered in (["a"], ["b"]) and consumer.running_count == 2  # one waits for the thread
    release.set()
    await harness.recorder.wait("finished", 2)
    assert sorted(entered) == ["a", "b"]


# -- the process pool (spawned processes: a few seconds on a small machine) ------------------------


@pytest.fixture
async def memory_harness(fake_clock: Any) -> Any:
    harness = Harness(lambda clock: MemoryDriver(clock=clock), fake_clock)
    harness.driver = harness.make_driver(fake_clock)
    harness.new_driver = lambda: harness.driver  # type: ignore[method-assign]
    harness.publisher.driver = harness.driver
    yield harness
    await harness.close()


async def test_cpu_bound_work_runs_in_a_process_with_its_context(memory_harness: Harness) -> None:
    harness = memory_harness
    handlers: dict[str, Any] = {}
    consumer = harness.consumer("w1", handlers, concurrency=3, process_pool_size=1)
    consumer.register("crunch", process_handlers.crunch, run_in="process")
    consumer.register("retry", process_handlers.retry_once, run_in="process")
    consumer.register("scale", process_handlers.Scaler(5), run_in="process")
    await harness.start(consumer)
    await harness.publisher.send_many(
        [
            Task("c", "crunch", {"n": 1000}, option=OPTION),
            Task("r", "retry", {}, option=OPTION),
            Task("s", "scale", {"n": 3}, option=OPTION),
        ]
    )
    await harness.discover()
    await harness.recorder.wait("finished", 3, timeout=60)
    crunched = await harness.get("c")
    assert crunched.results == [{"sum": 499500, "attempt_no": 1}]
    assert crunched.checkpoint is not None and crunched.checkpoint.data == {"done": 1000}
    assert crunched.progress is not None and crunched.progress.message == "half way"
    assert (await harness.get("s")).results == [15]
    retried = await harness.get("r")
    error = retried.worker_states[0].error
    assert (
        retried.fail_cnt == 1
        and error is not None
        and (error.type, error.message)
        == (
            "Retry",
            "not ready in a process",
        )
    )
    assert retried.next_due == harness.clock.now() + timedelta(seconds=60)


async def test_a_cancel_reaches_a_process_through_its_flag(memory_harness: Harness, tmp_path: Path) -> None:
    harness = memory_harness
    consumer = harness.consumer("w1", {}, process_pool_size=1)
    consumer.register("poll", process_handlers.until_cancelled, run_in="process")
    await harness.start(consumer)
    marker = tmp_path / "seen"
    await harness.publisher.send(Task("p", "poll", {"marker": str(marker)}, option=OPTION))
    await harness.discover()

    def exists(path: Path) -> bool:
        for _ in range(int(WAIT * 100)):
            if path.exists():
                return True
            threading.Event().wait(0.01)
        return False

    assert await asyncio.to_thread(exists, Path(str(marker) + ".started")), "the process did not start"
    await Operations(harness.driver, clock=harness.clock).cancel("p")
    await harness.advance(2.0)
    await harness.recorder.wait("finished", 1)
    assert await asyncio.to_thread(exists, marker), "the process did not see the flag"
    assert marker.read_text() == "cancelled"
    assert (await harness.get("p")).status is TaskStatus.CANCELLED
