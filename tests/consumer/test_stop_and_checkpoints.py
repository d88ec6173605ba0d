"""A stop reaches a running handler through the change stream (the ping is the fallback); a
stopping pause releases the attempt without using the budget; checkpoints and progress ride the
pinger's write and the next attempt resumes from the checkpoint (SPEC F14, F17, F22)."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from mscheduler import (
    InvalidInput,
    LeaseLost,
    Operations,
    Task,
    TaskContext,
    TaskOption,
    TaskStatus,
    TransitionRefused,
)
from mscheduler.drivers.base import ChangeEvent, PingParams, PingResult
from mscheduler.drivers.mongo.driver import MongoDriver
from tests.consumer.support import Gate, Harness, NoStreamDriver, ScriptedStreamDriver, WrappedDriver, settle
from tests.helpers import wait_until
from tests.scenarios.harness import is_mongomock

OPTION = TaskOption(
    ping_interval=timedelta(seconds=2), worker_timeout=timedelta(seconds=20), max_unexpected_retries=0
)


class CountingPings(WrappedDriver):
    """Counts ping calls and how many of them carried reports."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.pings: list[PingParams] = []
        self.commands: list[int] = []  # storage commands each ping cost (MongoDriver only)

    async def ping(self, params: PingParams) -> PingResult:
        self.pings.append(params)
        before = getattr(self.inner, "commands", 0)
        result: PingResult = await self.inner.ping(params)
        self.commands.append(getattr(self.inner, "commands", 0) - before)
        return result


def _needs_stream(harness: Harness) -> None:
    if is_mongomock(harness.driver):
        pytest.skip("mongomock has no change streams (the ping fallback is tested on it)")


def _blocking(gate: Gate, seen: list[str]) -> Any:
    async def work(params: Any, ctx: TaskContext) -> str:
        seen.append(f"start:{ctx.worker_id}:{ctx.checkpoint_data}")
        try:
            await gate.wait()
        except asyncio.CancelledError:
            seen.append(f"cancelled:{ctx.worker_id}")
            raise
        return "done"

    return work


async def _one_running(harness: Harness, handler: Any, *, driver: Any = None) -> Operations:
    w1 = harness.consumer("w1", {"work": handler}, driver=driver)
    await harness.start(w1)
    assert await harness.publisher.send(Task("t", "work", {}, option=OPTION))
    await harness.discover()
    await harness.recorder.wait("claimed", 1)
    return Operations(harness.driver, clock=harness.clock)


# -- cancel / pause reach the handler -----------------------------------------------------------


async def test_cancel_reaches_the_handler_through_the_stream_without_a_ping(harness: Harness) -> None:
    _needs_stream(harness)
    gate, seen = Gate(), list[Any]()
    ops = await _one_running(harness, _blocking(gate, seen))
    pings = harness.recorder.counts["ping"]
    await ops.cancel("t", "stop now")
    await harness.recorder.wait("cancelled", 1)  # no clock moved: the stream told the consumer
    await harness.recorder.wait("finished", 1)
    assert seen == ["start:w1:None", "cancelled:w1"]
    assert harness.recorder.counts["ping"] == pings  # it did not wait for (or need) a ping
    assert harness.finished()[0][1]["outcome"] == "cancelled"  # settled at once, fenced
    info = await harness.get("t")
    assert info.status is TaskStatus.CANCELLED and info.running_cnt == 0 and info.fail_cnt == 0


async def test_without_a_stream_the_cancel_arrives_with_the_next_ping(harness: Harness) -> None:
    gate, seen = Gate(), list[Any]()
    ops = await _one_running(harness, _blocking(gate, seen), driver=NoStreamDriver(harness.new_driver()))
    await ops.cancel("t")
    await settle()
    assert seen == ["start:w1:None"]  # still running: nobody told it yet
    await harness.advance(2.0)  # the ping interval
    await harness.recorder.wait("cancelled", 1)
    assert seen == ["start:w1:None", "cancelled:w1"]


@pytest.mark.parametrize("stream", [True, False])
async def test_pause_stop_releases_the_attempt_and_resume_runs_it_again(
    harness: Harness, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    if stream:
        _needs_stream(harness)
    gate, seen = Gate(), list[Any]()
    driver = harness.new_driver() if stream else NoStreamDriver(harness.new_driver())
    ops = await _one_running(harness, _blocking(gate, seen), driver=driver)
    w1 = harness.consumers[0]
    with caplog.at_level(logging.INFO, logger="mscheduler.consumer"):
        info = await ops.pause("t", stop_running=True)
        # told to stop: the attempt holds its slot until its consumer settles it
        assert info.status is TaskStatus.RUNNING and info.paused
        if not stream:
            await settle()
            assert seen == ["start:w1:None"]
            await harness.advance(2.0)  # the next ping tells
        await harness.recorder.wait("paused", 1)
        await harness.recorder.wait("finished", 1)
    assert seen == ["start:w1:None", "cancelled:w1"]
    assert harness.finished()[0][1]["outcome"] == "released"  # not a lost lease, not a failure
    assert w1.stats["released"] == 1 and w1.stats["lost"] == 0 and w1.stats["failed"] == 0
    assert any("stopped by a pause" in r.getMessage() for r in caplog.records)
    assert not any("lease lost" in r.getMessage() for r in caplog.records)
    info = await harness.get("t")
    assert [w.status.value for w in info.worker_states] == ["released"]
    assert info.worker_states[0].error is not None and info.worker_states[0].error.type == "Paused"
    await harness.discover()
    assert harness.claims("t") == ["w1"]  # paused: not claimed again
    gate.open()
    await ops.resume("t")
    await harness.discover()
    await harness.recorder.wait("finished", 2)
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED and info.fail_cnt == 0  # the budget (0) untouched
    assert harness.claims("t") == ["w1", "w1"]


async def test_a_handler_told_to_stop_cannot_save_a_checkpoint(harness: Harness) -> None:
    _needs_stream(harness)
    gate, refused = Gate(), []

    async def stubborn(params: Any, ctx: TaskContext) -> None:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            try:
                await ctx.checkpoint({"late": True})
            except LeaseLost as exc:
                refused.append(str(exc))
            raise

    ops = await _one_running(harness, stubborn)
    await ops.cancel("t")
    await harness.recorder.wait("finished", 1)
    assert refused == ["the checkpoint was not saved: the attempt was cancelled"]
    assert (await harness.get("t")).checkpoint is None


# -- checkpoints and progress -------------------------------------------------------------------


async def test_checkpoint_and_progress_are_stored_and_shown(harness: Harness) -> None:
    saved = asyncio.Event()
    gate = Gate()

    async def long(params: Any, ctx: TaskContext) -> str:
        ctx.progress(0.25, "a quarter")
        await ctx.checkpoint({"step": 1})  # returns once stored
        saved.set()
        ctx.progress(0.5)  # no flush of its own: goes with the next ping
        await gate.wait()
        return "done"

    counting = CountingPings(harness.new_driver())
    await _one_running(harness, long, driver=counting)
    await asyncio.wait_for(saved.wait(), 5)
    assert len(counting.pings) == 1  # the checkpoint's early ping, progress with it
    info = await harness.get("t")
    assert info.checkpoint is not None and info.checkpoint.data == {"step": 1}
    assert info.checkpoint.worker_id == "w1" and info.checkpoint.attempt == info.worker_states[0].attempt
    assert info.progress is not None and (info.progress.fraction, info.progress.message) == (
        0.25,
        "a quarter",
    )
    await harness.advance(2.0)  # the regular ping carries the newer progress
    info = await harness.get("t")
    assert info.progress is not None and (info.progress.fraction, info.progress.message) == (0.5, None)
    await harness.advance(2.0)  # nothing new: a plain ping again
    assert [bool(p.reports) for p in counting.pings] == [True, True, False]
    gate.open()
    await harness.recorder.wait("finished", 1)


async def test_changing_progress_is_written_about_once_a_second_not_only_with_the_next_ping(
    harness: Harness,
) -> None:
    """Progress reported many times is written within a second of the last ping (well before
    the next lease renewal, 2 s here), and at most once a second however often it changes."""
    reported = asyncio.Event()
    go_on = Gate()
    gate = Gate()

    async def long(params: Any, ctx: TaskContext) -> str:
        for step in range(1, 101):  # a hundred reports at once: one write
            ctx.progress(step / 200, f"row {step}")
        reported.set()
        await go_on.wait()
        ctx.progress(0.9, "almost")
        await gate.wait()
        return "done"

    counting = CountingPings(harness.new_driver())
    await _one_running(harness, long, driver=counting)
    await asyncio.wait_for(reported.wait(), 5)
    await settle()  # no clock moved: the first progress is written at once, the newest of them
    assert len(counting.pings) == 1 and counting.pings[0].reports
    info = await harness.get("t")
    assert info.progress is not None and (info.progress.fraction, info.progress.message) == (0.5, "row 100")
    go_on.open()
    await settle()
    await harness.advance(0.5)  # within a second of the last write: waits
    assert len(counting.pings) == 1
    await harness.advance(0.6)
    assert len(counting.pings) == 2 and (await harness.get("t")).progress.fraction == 0.9  # type: ignore[union-attr]
    gate.open()
    await harness.recorder.wait("finished", 1)


async def test_checkpoints_of_many_handlers_cost_one_storage_command(harness: Harness) -> None:
    n = 6
    gate = Gate()
    saved: list[str] = []

    async def step(params: Any, ctx: TaskContext) -> None:
        await gate.wait()
        await ctx.checkpoint({"key": ctx.key, "step": 1})
        saved.append(ctx.key)
        await asyncio.Event().wait()  # runs on

    counting = CountingPings(harness.new_driver())
    consumer = harness.consumer("w1", {"work": step}, driver=counting, concurrency=n)
    await harness.start(consumer)
    for i in range(n):
        assert await harness.publisher.send(Task(f"t{i}", "work", {}, option=OPTION))
    await harness.discover()
    await harness.recorder.wait("claimed", n)
    await wait_until(lambda: gate.waiting == n, what=f"{n} handlers to wait at the gate")
    assert counting.pings == []
    gate.open()  # every handler saves at once
    for _ in range(200):
        if len(saved) == n:
            break
        await asyncio.sleep(0)
    assert sorted(saved) == sorted(f"t{i}" for i in range(n))
    assert len(counting.pings) == 1 and len(counting.pings[0].reports) == n
    if isinstance(counting.inner, MongoDriver):
        assert counting.commands == [2]  # one bulk write + the ping's read, for all six
    for i in range(n):
        info = await harness.get(f"t{i}")
        assert info.checkpoint is not None and info.checkpoint.data == {"key": f"t{i}", "step": 1}


async def test_no_checkpoint_no_extra_command(harness: Harness) -> None:
    """The hot path stays as it was: a plain ping (one write per lease length + a read)."""
    gate = Gate()
    counting = CountingPings(harness.new_driver())
    await _one_running(harness, _blocking(gate, []), driver=counting)
    await harness.advance(2.0)
    assert len(counting.pings) == 1 and counting.pings[0].reports == {}
    if isinstance(counting.inner, MongoDriver):
        assert counting.commands == [2]  # one update_many + the read, as before checkpoints
    gate.open()
    await harness.recorder.wait("finished", 1)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.checkpoint({"blob": "x" * 2000}), "more than max_checkpoint_bytes"),
        (lambda ctx: ctx.checkpoint({"$where": 1}), "cannot be stored"),
        (lambda ctx: ctx.checkpoint({1, 2}), "cannot be stored"),
        (lambda ctx: _aw(ctx.progress(1.5)), "from 0 to 1"),
        (lambda ctx: _aw(ctx.progress(float("nan"))), "from 0 to 1"),
        (lambda ctx: _aw(ctx.progress(True)), "from 0 to 1"),
        (lambda ctx: _aw(ctx.progress(0.5, 42)), "message"),
    ],
)
async def test_bad_checkpoints_and_progress_are_refused(harness: Harness, call: Any, message: str) -> None:
    errors: list[str] = []

    async def work(params: Any, ctx: TaskContext) -> str:
        try:
            await call(ctx)
        except InvalidInput as exc:
            errors.append(str(exc))
        return "done"

    w1 = harness.consumer("w1", {"work": work}, max_checkpoint_bytes=1000)
    await harness.start(w1)
    assert await harness.publisher.send(Task("t", "work", {}, option=OPTION))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    assert len(errors) == 1 and message in errors[0]
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED and info.checkpoint is None and info.progress is None


async def _aw(value: None) -> None:
    return value


def test_max_checkpoint_bytes_is_validated(harness: Harness) -> None:
    with pytest.raises(InvalidInput, match="max_checkpoint_bytes"):
        harness.consumer("w1", {"work": _blocking(Gate(), [])}, max_checkpoint_bytes=0)


async def test_resume_after_a_pause_starts_from_the_checkpoint(harness: Harness) -> None:
    _needs_stream(harness)
    seen: list[Any] = []
    first_saved = asyncio.Event()

    async def long(params: Any, ctx: TaskContext) -> int:
        seen.append(ctx.checkpoint_data)
        start = (ctx.checkpoint_data or {}).get("done", 0)
        for step in range(start + 1, 6):
            await ctx.checkpoint({"done": step})
            if step == 2 and start == 0:
                first_saved.set()
                await asyncio.Event().wait()  # paused here
        return start

    ops = await _one_running(harness, long)
    await asyncio.wait_for(first_saved.wait(), 5)
    await ops.pause("t", stop_running=True)
    await harness.recorder.wait("finished", 1)
    await ops.resume("t")
    await harness.discover()
    await harness.recorder.wait("finished", 2)
    assert seen == [None, {"done": 2}]
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED and info.results == [2]
    assert info.checkpoint is not None and info.checkpoint.data == {"done": 5}


async def test_two_cancels_at_once_one_wins(harness: Harness) -> None:
    gate, seen = Gate(), list[Any]()
    ops = await _one_running(harness, _blocking(gate, seen))
    other = Operations(harness.new_driver(), clock=harness.clock)
    first, second = await asyncio.gather(ops.cancel("t", "a"), other.cancel("t", "b"), return_exceptions=True)
    winners = [r for r in (first, second) if not isinstance(r, BaseException)]
    losers = [r for r in (first, second) if isinstance(r, BaseException)]
    assert len(winners) == 1 and len(losers) == 1
    assert isinstance(losers[0], TransitionRefused) and losers[0].status == "cancelled"
    info = await harness.get("t")
    assert info.status is TaskStatus.CANCELLED and info.cancelled is not None
    assert info.cancelled["reason"] == winners[0].cancelled["reason"]  # type: ignore[index]
    await harness.advance(2.0)  # the stream or the next ping stops the handler
    await harness.recorder.wait("cancelled", 1)


def _stop_event(stop: str, attempts: tuple[str, ...] | None) -> ChangeEvent:
    return ChangeEvent("t", "", None, None, (), token=None, claimers=(), stop=stop, stop_attempts=attempts)


async def test_a_stop_event_is_checked_against_the_running_attempt(harness: Harness) -> None:
    """Events are hints: one about another attempt of the task is ignored; one that does not say
    whose attempts (a server's field-by-field report) makes the consumer ask the store at once."""
    gate, seen = Gate(), list[Any]()
    scripted = ScriptedStreamDriver(harness.new_driver())
    ops = await _one_running(harness, _blocking(gate, seen), driver=scripted)
    pings = harness.recorder.counts["ping"]
    scripted.push(_stop_event("cancel", ("an-earlier-attempt",)))
    await settle()
    assert seen == ["start:w1:None"] and harness.recorder.counts["ping"] == pings
    await ops.cancel("t")  # this scripted stream does not announce it; the event below does
    scripted.push(_stop_event("unknown", None))
    await harness.recorder.wait("cancelled", 1)  # no clock moved: an early ping asked the store
    assert harness.recorder.counts["ping"] == pings + 1
    assert seen == ["start:w1:None", "cancelled:w1"]
