"""End-to-end on every driver: publish, consume, retry, results."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskContext, TaskOption, TaskStatus
from tests.helpers import Recorder


class Add(BaseModel):
    n: int


async def test_tasks_run_and_failures_are_retried(make_driver, fake_clock: FakeClock) -> None:
    driver = make_driver(fake_clock)
    publisher = Publisher(driver, clock=fake_clock)
    consumer = Consumer(driver, concurrency=4, clock=fake_clock, poll_interval=0.5)

    @consumer.handler("add")
    async def add(params: Add, ctx: TaskContext) -> int:
        if params.n == 3 and ctx.attempt_no == 1:
            raise RuntimeError("first try fails")
        return params.n + 1

    recorder = Recorder(consumer)
    option = TaskOption(retry_delay=timedelta(seconds=2))
    async with consumer:
        created = await publisher.send_many([Task(f"t{i}", "add", {"n": i}, option=option) for i in range(5)])
        assert created == [True] * 5
        await recorder.wait("finished", 5)
        fake_clock.advance(timedelta(seconds=3))
        await recorder.wait("finished", 6)
    for i in range(5):
        info = await publisher.get(f"t{i}")
        assert info.status is TaskStatus.SUCCEEDED, info
        assert info.results == [i + 1]
    failed_once = await publisher.get("t3")
    assert [w.status.value for w in failed_once.worker_states] == ["failed", "succeeded"]
    assert failed_once.worker_states[0].error is not None
    assert failed_once.worker_states[0].error.message == "first try fails"
