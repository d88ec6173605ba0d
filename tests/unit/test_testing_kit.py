"""The testing kit (``mscheduler.testing``, SPEC G9): one call wires store, publisher and consumers
on one fake clock (memory or mongomock); ``wait()`` works under the fake clock without anyone
moving it, and drives it through retries an hour apart; ``run_handler`` runs a handler once with a
real context; eager mode runs each send to its end; passing ``clock=`` to only a publisher or a
consumer is refused instead of silently running nothing; the pytest plugin's fixtures work in a
project of their own."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mscheduler import (
    App,
    Consumer,
    Fail,
    FakeClock,
    InvalidInput,
    MemoryDriver,
    Publisher,
    Retry,
    Snooze,
    SyncTaskContext,
    Task,
    TaskContext,
    TaskFailed,
    TaskOption,
    TaskStatus,
)
from mscheduler.testing import run_handler, scheduler_kit


class Order(BaseModel):
    order_id: int


def shop() -> App:
    app = App("shop")

    @app.handler("invoice")
    async def invoice(params: Order, ctx: TaskContext) -> dict[str, int]:
        ctx.progress(0.5, "half")
        await ctx.checkpoint({"step": 1})
        return {"order": params.order_id, "attempt": ctx.attempt_no}

    @app.handler("flaky")
    async def flaky(params: Any, ctx: TaskContext) -> str:
        if ctx.attempt_no < 3:
            raise Retry(after=3600, reason="try in an hour")
        return "third time lucky"

    @app.handler("render")
    def render(params: Order, ctx: SyncTaskContext) -> str:  # in a thread
        ctx.progress(1.0)
        return f"receipt-{params.order_id}"

    @app.handler("broken")
    async def broken(params: Any) -> None:
        raise Fail("bad data")

    return app


@pytest.mark.parametrize("store", ["memory", "mongomock"])
async def test_one_call_wires_everything_on_one_clock(store: str) -> None:
    kit = scheduler_kit(shop(), store=store)
    assert all(c.clock.base is kit.clock for c in kit.consumers)
    assert kit.publisher.clock is kit.clock and kit.operations.clock.base is kit.clock
    async with kit:
        await kit.publisher.send(Task("inv-1", "invoice", {"order_id": 7}))
        assert await kit.publisher.wait("inv-1") == {"order": 7, "attempt": 1}
        await kit.publisher.send(Task("r-1", "render", {"order_id": 8}))
        assert await kit.publisher.wait("r-1") == "receipt-8"
        # an hour between attempts, no real waiting
        await kit.publisher.send(Task("f-1", "flaky", {}, option=TaskOption(max_unexpected_retries=5)))
        started = kit.clock.now()
        assert await kit.publisher.wait("f-1") == "third time lucky"
        assert kit.clock.now() - started >= timedelta(hours=2)
        await kit.publisher.send(Task("b-1", "broken", {}))
        with pytest.raises(TaskFailed, match="bad data"):
            await kit.publisher.wait("b-1")


async def test_plain_publisher_wait_returns_under_a_fake_clock_nobody_moves() -> None:
    """The newcomer's trap: wait() slept on the fake clock and never looked again."""
    clock = FakeClock()
    driver = MemoryDriver(clock=clock)
    consumer = Consumer(driver, clock=clock)

    async def double(params: dict[str, int]) -> int:
        return params["n"] * 2

    consumer.register("double", double)
    publisher = Publisher(driver, clock=clock)
    async with consumer:
        await publisher.send(Task("d", "double", {"n": 21}))
        assert await publisher.wait("d") == 42
    assert clock.monotonic() == 0.0  # no one moved it


@pytest.mark.parametrize("half", ["publisher", "consumer"])
def test_a_clock_given_to_one_side_only_is_refused(half: str) -> None:
    """The other trap: clock= on the publisher and the consumer but not on the store ran nothing."""
    driver = MemoryDriver()  # the system clock
    with pytest.raises(InvalidInput, match=r"MemoryDriver\(clock=clock\)"):
        if half == "publisher":
            Publisher(driver, clock=FakeClock())
        else:
            Consumer(driver, clock=FakeClock())


async def test_wait_says_why_a_task_cannot_end() -> None:
    async with scheduler_kit(shop()) as kit:
        await kit.publisher.send(Task("x", "nobody_handles_this", {}))
        with pytest.raises(TimeoutError, match="needs a handler for 'nobody_handles_this'"):
            await kit.publisher.wait("x")
        await kit.publisher.send(Task("p", "invoice", {"order_id": 1}))
        await kit.operations.pause("p")
        with pytest.raises(TimeoutError, match="is paused"):
            await kit.publisher.wait("p")
        slow = TaskOption(run_at=kit.clock.now() + timedelta(days=3))
        await kit.publisher.send(Task("later", "invoice", {"order_id": 2}, option=slow))
        with pytest.raises(TimeoutError, match="within 60 s of fake time"):
            await kit.publisher.wait("later", timeout=60)


async def test_eager_sends_run_each_task_to_its_end() -> None:
    async with scheduler_kit(shop(), eager=True) as kit:
        assert await kit.publisher.send(Task("e-1", "invoice", {"order_id": 3}))
        info = await kit.operations.get_task("e-1")  # done when send returned
        assert info.status is TaskStatus.SUCCEEDED and info.results == [{"order": 3, "attempt": 1}]
        assert info.checkpoint is not None and info.checkpoint.data == {"step": 1}
        await kit.publisher.send_many([Task("e-2", "broken", {}), Task("e-3", "render", {"order_id": 4})])
        assert (await kit.operations.get_task("e-2")).status is TaskStatus.FAILED
        assert (await kit.operations.get_task("e-3")).results == ["receipt-4"]


# -- run_handler --------------------------------------------------------------------------------------


async def test_run_handler_gives_the_result_progress_and_checkpoints() -> None:
    app = shop()
    invoice = app._handlers["invoice"][0]
    run = await run_handler(invoice, {"order_id": 9}, attempt_no=2)
    assert run.outcome == "succeeded" and run.result == {"order": 9, "attempt": 2}
    assert run.progress == [(0.5, "half")] and run.checkpoints == [{"step": 1}]
    render = app._handlers["render"][0]
    run = await run_handler(render, {"order_id": 5})  # a plain function, in a thread
    assert (run.outcome, run.result, run.progress) == ("succeeded", "receipt-5", [(1.0, None)])


async def test_run_handler_gives_the_verdict() -> None:
    async def steer(params: dict[str, str], ctx: TaskContext) -> None:
        kind = params["kind"]
        if kind == "retry":
            raise Retry(after=30)
        if kind == "snooze":
            raise Snooze(after=timedelta(minutes=5))
        if kind == "fail":
            raise Fail("no")
        raise ValueError("broken")

    retried = await run_handler(steer, {"kind": "retry"})
    assert retried.outcome == "retry" and isinstance(retried.verdict, Retry)
    assert retried.verdict.after == timedelta(seconds=30)
    snoozed = await run_handler(steer, {"kind": "snooze"})
    assert snoozed.outcome == "snoozed" and isinstance(snoozed.verdict, Snooze)
    failed = await run_handler(steer, {"kind": "fail"})
    assert failed.outcome == "failed" and isinstance(failed.verdict, Fail)
    crashed = await run_handler(steer, {"kind": "other"})
    assert crashed.outcome == "failed" and crashed.verdict is None and isinstance(crashed.error, ValueError)


async def test_run_handler_applies_the_consumer_rules() -> None:
    async def with_model(params: Order) -> int:
        return params.order_id

    bad = await run_handler(with_model, {"order_id": "not a number"})
    assert bad.outcome == "rejected" and bad.rejected is not None and "InvalidParams" in bad.rejected

    async def returns_a_set(params: Any) -> Any:
        return {1, 2}

    unstorable = await run_handler(returns_a_set, {})
    assert unstorable.outcome == "rejected" and "ResultNotStorable" in (unstorable.rejected or "")

    async def saves_too_much(params: Any, ctx: TaskContext) -> None:
        await ctx.checkpoint({"blob": "x" * 1000})

    too_big = await run_handler(saves_too_much, {}, max_checkpoint_bytes=100)
    assert too_big.outcome == "failed" and isinstance(too_big.error, InvalidInput)

    async def resumes(params: Any, ctx: TaskContext) -> Any:
        return ctx.checkpoint_data

    assert (await run_handler(resumes, {}, checkpoint={"done": 4})).result == {"done": 4}


# -- the pytest plugin, in a project of its own ------------------------------------------------------

PLUGIN_TEST = """
from mscheduler import App, Task, TaskContext

app = App("mine")


@app.handler("hello")
async def hello(params, ctx: TaskContext):
    ctx.progress(1.0, "done")
    return f"hello {params['who']}"


async def test_kit(mscheduler_kit, mscheduler_clock):
    async with mscheduler_kit(app) as kit:
        assert kit.clock is mscheduler_clock
        await kit.publisher.send(Task("h", "hello", {"who": "you"}))
        assert await kit.publisher.wait("h") == "hello you"


async def test_eager(mscheduler_kit):
    async with mscheduler_kit(app, eager=True) as kit:
        await kit.publisher.send(Task("h", "hello", {"who": "eager"}))
        assert (await kit.operations.get_task("h")).results == ["hello eager"]


async def test_run_handler(mscheduler_run_handler):
    run = await mscheduler_run_handler(hello, {"who": "me"})
    assert run.result == "hello me" and run.progress == [(1.0, "done")]
"""


def test_the_pytest_plugin_is_found_by_its_entry_point(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(PLUGIN_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout


def test_the_examples_of_docs_testing_run(tmp_path: Path) -> None:
    """docs/testing.md's blocks, in order, as one test module of a project of its own."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    checkout = (
        "\n\nasync def checkout(publisher, order_id):\n"
        "    await publisher.send(Task(f'invoice-{order_id}', 'send_invoice',"
        " {'order_id': order_id, 'email': 'c@d.e'}))\n"
    )
    (tmp_path / "test_docs.py").write_text("\n\n".join(blocks) + checkout)
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "7 passed" in done.stdout
