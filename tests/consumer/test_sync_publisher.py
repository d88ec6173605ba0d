"""``SyncPublisher``: ``Publisher``'s methods for synchronous code, with the same results and the
same exceptions — on a loop of its own in a background thread, or on the loop the store lives on
(the testing kit's ``kit.sync_publisher()``), called from other threads."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from mscheduler import (
    App,
    Fail,
    InvalidInput,
    MemoryDriver,
    MongoDriver,
    OptionChange,
    Publisher,
    SyncPublisher,
    Task,
    TaskCancelled,
    TaskFailed,
    UnknownTask,
)
from mscheduler.testing import scheduler_kit
from mscheduler.testing.mongomock import mongomock_database


def test_send_get_and_send_many_from_plain_code() -> None:
    with SyncPublisher(MemoryDriver()) as sync:
        assert sync.send(Task("a", "job", {"n": 1})) is True
        assert sync.send(Task("a", "job", {"n": 2})) is False  # idempotent by key, left alone
        assert sync.get("a").params == {"n": 1}
        assert sync.send_many(Task(f"b-{i}", "job") for i in range(3)) == [True, True, True]
        assert sync.update_option("a", OptionChange(priority=7)).priority == 7
        thread = sync._thread
        assert thread is not None and thread.daemon and thread is not threading.current_thread()
    assert thread is not None and not thread.is_alive()  # close() stopped its loop


def test_the_same_exceptions_as_the_publisher() -> None:
    sync = SyncPublisher(MemoryDriver())
    with pytest.raises(InvalidInput, match="send_many got the key 'x' twice"):
        sync.send_many([Task("x", "job"), Task("x", "job")])
    with pytest.raises(UnknownTask):
        sync.get("missing")
    with pytest.raises(InvalidInput, match="send\\(\\) takes a Task, got dict"):
        sync.send({"key": "x"})  # type: ignore[arg-type]
    sync.send(Task("waits", "nobody_handles_it"))
    with pytest.raises(TimeoutError, match="no live worker handles tasks named 'nobody_handles_it'"):
        sync.wait("waits", timeout=0.1)
    sync.close()
    sync.close()  # idempotent
    with pytest.raises(InvalidInput, match="closed"):
        sync.send(Task("late", "job"))


def test_it_refuses_what_cannot_work() -> None:
    with pytest.raises(InvalidInput, match="takes a driver or a Publisher, got str"):
        SyncPublisher("mongodb://localhost")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="clock belong to the Publisher given"):
        SyncPublisher(Publisher(MemoryDriver()), clock=None)


def test_mongo_drivers_queries_run_on_its_loop() -> None:
    """The Mongo driver (here on mongomock) is used only from the SyncPublisher's own loop."""
    with SyncPublisher(MongoDriver(mongomock_database(), create_indexes=True)) as sync:
        assert sync.send_many([Task("m-1", "job", {"n": 1}), Task("m-2", "job")]) == [True, True]
        assert sync.send(Task("m-1", "job")) is False
        assert sync.get("m-1").params == {"n": 1}


def make_app() -> App:
    app = App("shop")

    @app.handler("double")
    def double(params: dict[str, int]) -> int:
        return params["n"] * 2

    @app.handler("refuse")
    async def refuse(params: Any) -> None:
        raise Fail("no stock")

    @app.handler("hang")
    async def hang(params: Any) -> None:
        await asyncio.Event().wait()

    return app


def a_view(sync: SyncPublisher, n: int) -> Any:
    """What a Flask or Django view does: send, then (here) wait for the outcome."""
    sync.send(Task(f"double-{n}", "double", {"n": n}))
    return sync.wait(f"double-{n}", timeout=60)


async def test_the_kit_runs_synchronous_code_in_a_thread_on_its_fake_clock() -> None:
    async with scheduler_kit(make_app()) as kit:
        sync = kit.sync_publisher()
        assert await asyncio.to_thread(a_view, sync, 21) == 42
        await asyncio.to_thread(sync.send, Task("r", "refuse"))
        with pytest.raises(TaskFailed) as failed:
            await asyncio.to_thread(sync.wait, "r")
        assert failed.value.error is not None and failed.value.error["message"] == "no stock"
        await asyncio.to_thread(sync.send, Task("h", "hang"))
        await kit.advance(0.1)
        await kit.operations.cancel("h", "not needed")
        with pytest.raises(TaskCancelled):
            await asyncio.to_thread(sync.wait, "h")
        with pytest.raises(InvalidInput, match="would wait for itself"):
            sync.send(Task("on-the-loop", "double", {"n": 1}))  # from the loop's own thread


async def test_eager_mode_applies_to_its_sends() -> None:
    async with scheduler_kit(make_app(), eager=True) as kit:
        sync = kit.sync_publisher()
        assert await asyncio.to_thread(sync.send, Task("e", "double", {"n": 4}))
        assert (await kit.operations.get_task("e")).results == [8]  # ran to its end already
