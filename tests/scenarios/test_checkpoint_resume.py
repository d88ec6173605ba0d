"""A long task checkpoints its way (SPEC F22): killed after saving 3 of 10 steps, it resumes at
step 4 on another worker, and the dead worker's stale saves can never overwrite the new owner's."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.drivers.base import AttemptReport, PingParams
from mscheduler.testing.faults import FaultyDriver, crash_consumer
from tests.helpers import Recorder
from tests.scenarios.harness import advance_until

WORKER_TIMEOUT = timedelta(seconds=5)
OPTION = TaskOption(
    ping_interval=timedelta(seconds=1), worker_timeout=WORKER_TIMEOUT, retry_delay=timedelta(seconds=1)
)
STEPS = 10


def consumer(driver: Any, worker_id: str, clock: FakeClock) -> Consumer:
    return Consumer(driver, worker_id=worker_id, clock=clock, poll_interval=1.0, concurrency=2)


async def test_killed_after_three_of_ten_steps_it_resumes_at_step_four_elsewhere(
    make_driver, fake_clock: FakeClock
) -> None:
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a = consumer(FaultyDriver(store), "A", fake_clock)
    b = consumer(make_driver(fake_clock), "B", fake_clock)
    done_steps: list[tuple[str, int]] = []
    resumed_from: list[Any] = []
    three_saved = asyncio.Event()

    async def import_rows(params: Any, ctx: TaskContext) -> int:
        resumed_from.append(ctx.checkpoint_data)
        start = ctx.checkpoint_data["done"] if ctx.checkpoint_data else 0
        for step in range(start + 1, STEPS + 1):
            done_steps.append((ctx.worker_id, step))
            await ctx.checkpoint({"done": step})
            ctx.progress(step / STEPS, f"{step} of {STEPS}")
            if ctx.worker_id == "A" and step == 3:
                three_saved.set()
                await asyncio.Event().wait()  # the process dies here
        return STEPS - start

    a.register("import", import_rows)
    b.register("import", import_rows)
    recorder = Recorder(a, b)
    await publisher.send(Task("big-import", "import", option=OPTION))
    await a.start()
    await asyncio.wait_for(three_saved.wait(), 5)
    await b.start()
    await crash_consumer(a)
    stale_attempt = (await store.get_task("big-import"))["state"]["worker_states"][0]["attempt"]

    def b_finished() -> bool:
        return any(w == "B" for w, _ in recorder.of("finished"))

    await advance_until(fake_clock, b_finished, step=0.25, limit=60)
    await b.stop()

    assert resumed_from == [None, {"done": 3}]
    assert done_steps == [("A", 1), ("A", 2), ("A", 3), *(("B", s) for s in range(4, STEPS + 1))]
    info = await publisher.get("big-import")
    assert info.status is TaskStatus.SUCCEEDED and info.results == [7]
    assert [(w.worker_id, w.status.value) for w in info.worker_states] == [("A", "lost"), ("B", "succeeded")]
    assert info.checkpoint is not None and info.checkpoint.data == {"done": STEPS}
    assert info.checkpoint.worker_id == "B"
    assert info.progress is not None and info.progress.worker_id == "B"

    # A's process comes back from the dead and pings with a stale save: fenced out
    before = await store.get_task("big-import")
    now = fake_clock.now()
    stale = PingParams(
        "A",
        now,
        {now + WORKER_TIMEOUT: {"big-import": stale_attempt}},
        {"big-import": AttemptReport(99, save_checkpoint=True, checkpoint={"done": 3})},
    )
    result = await store.ping(stale)
    assert result.lost == ["big-import"] and result.recorded == []
    assert await store.get_task("big-import") == before
