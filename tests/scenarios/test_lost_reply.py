"""Storage calls whose reply is lost (applied, but the caller hears an error) or that fail outright.

At this seam (``FaultyDriver``) the consumer sees what it would see after the Mongo driver's own
retries gave up with the outcome unknown. A claim it never heard of leaves an orphan lease that
expires like a crashed worker's; a finish it retries is refused by the fence, never applied twice.
(Below the seam, ``MongoDriver`` recovers most lost replies itself: test_mongo_retries.py.)
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, cast

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskContext, TaskOption, TaskStatus
from mscheduler.testing.faults import FaultyDriver
from tests.helpers import Recorder, as_driver
from tests.scenarios.harness import Overlap, advance, advance_until, running_entries

WORKER_TIMEOUT = timedelta(seconds=5)
OPTION = TaskOption(
    ping_interval=timedelta(seconds=1), worker_timeout=WORKER_TIMEOUT, retry_delay=timedelta(seconds=1)
)
POLL = 1.0
STEP = 0.25


def consumer(driver: Any, worker_id: str, clock: FakeClock) -> Consumer:
    return Consumer(driver, worker_id=worker_id, clock=clock, poll_interval=POLL, claim_lease=WORKER_TIMEOUT)


async def test_claim_whose_reply_was_lost_is_not_stuck(make_driver, fake_clock: FakeClock) -> None:
    """The claim was applied but A never heard: the orphan lease expires, then the task runs."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    a_driver.fail_next("claim", after_apply=True)
    a = consumer(a_driver, "A", fake_clock)
    runs: list[int] = []

    async def work(params: Any, ctx: TaskContext) -> str:
        runs.append(ctx.attempt_no)
        return "ok"

    a.register("job", work)
    recorder = Recorder(a)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await advance_until(fake_clock, lambda: bool(a_driver.faults), step=STEP, limit=10)
    orphan = running_entries(await store.get_task("t1"))
    assert [e["worker_id"] for e in orphan] == ["A"], "applied, though A never heard of it"

    took = await advance_until(fake_clock, lambda: recorder.counts["finished"] >= 1, step=STEP, limit=60)
    assert took <= WORKER_TIMEOUT.total_seconds() + POLL + STEP, "no longer than a crashed worker's lease"
    await a.stop()
    info = await publisher.get("t1")
    assert info.status is TaskStatus.SUCCEEDED
    assert [w.status.value for w in info.worker_states] == ["lost", "succeeded"]
    assert runs == [2], "the handler ran once, for the second (rescued) attempt"


async def test_orphaned_claim_counts_as_a_lost_attempt(make_driver, fake_clock: FakeClock) -> None:
    """Known edge, documented: an orphan is indistinguishable from a crash right after the claim,
    so it uses one retry. With ``max_unexpected_retries=0`` the task fails without having run."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    a_driver.fail_next("claim", after_apply=True)
    a = consumer(a_driver, "A", fake_clock)
    runs: list[str] = []

    async def work(params: Any) -> None:
        runs.append("ran")

    a.register("job", work)
    await publisher.send(Task("t1", "job", option=OPTION.model_copy(update={"max_unexpected_retries": 0})))
    await a.start()

    async def failed() -> bool:
        return (await publisher.get("t1")).status is TaskStatus.FAILED

    await advance_until(fake_clock, failed, step=STEP, limit=60)
    await a.stop()
    info = await publisher.get("t1")
    assert [w.status.value for w in info.worker_states] == ["lost"]
    assert info.last_error is not None and info.last_error.type == "LeaseExpired"
    assert runs == []


async def test_finish_whose_reply_was_lost_lands_once(make_driver, fake_clock: FakeClock) -> None:
    """The success was stored, the reply lost; the consumer's retry is refused, nothing runs again."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    a_driver.fail_next("finish", after_apply=True)
    a = consumer(a_driver, "A", fake_clock)
    runs: list[int] = []

    async def work(params: Any, ctx: TaskContext) -> str:
        runs.append(ctx.attempt_no)
        return "result"

    a.register("job", work)
    recorder = Recorder(a)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await advance_until(fake_clock, lambda: recorder.counts["finished"] >= 1, step=STEP, limit=10)
    assert a_driver.calls["finish"] == 2, "retried once after the lost reply"
    assert [d["outcome"] for _, d in recorder.of("finished")] == ["succeeded"], "the retry says it landed"
    await advance(fake_clock, 3 * WORKER_TIMEOUT.total_seconds())
    await a.stop()
    info = await publisher.get("t1")
    assert info.status is TaskStatus.SUCCEEDED
    assert [w.status.value for w in info.worker_states] == ["succeeded"]
    assert info.results == ["result"]
    assert runs == [1]


async def test_finish_that_failed_before_applying_is_retried_until_it_lands(
    make_driver, fake_clock: FakeClock
) -> None:
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    a_driver.fail_next("finish", times=3)
    a = consumer(a_driver, "A", fake_clock)

    async def work(params: Any) -> str:
        return "result"

    a.register("job", work)
    recorder = Recorder(a)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await advance_until(fake_clock, lambda: recorder.counts["finished"] >= 1, step=STEP, limit=10)
    await a.stop()
    assert a_driver.calls["finish"] == 4
    assert [d["outcome"] for _, d in recorder.of("finished")] == ["succeeded"]
    info = await publisher.get("t1")
    assert [w.status.value for w in info.worker_states] == ["succeeded"]


async def test_ping_whose_reply_was_lost_keeps_the_lease(make_driver, fake_clock: FakeClock) -> None:
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    a = consumer(a_driver, "A", fake_clock)
    release = asyncio.Event()

    async def work(params: Any) -> str:
        await release.wait()
        return "ok"

    a.register("job", work)
    recorder = Recorder(a)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await recorder.wait("claimed")
    a_driver.fail_next("ping", after_apply=True, times=2)
    await advance(fake_clock, 3 * WORKER_TIMEOUT.total_seconds())
    assert recorder.counts["lost"] == 0
    release.set()
    await recorder.wait("finished")
    await a.stop()
    info = await publisher.get("t1")
    assert [w.status.value for w in info.worker_states] == ["succeeded"]


async def test_pings_that_keep_failing_stop_the_handler_at_its_lease_end(
    make_driver, fake_clock: FakeClock
) -> None:
    """No store to ask: a lease past its last confirmed end is lost, the handler is cancelled, and
    another consumer takes the task over after the lease (never before)."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    a_driver = FaultyDriver(store)
    a = consumer(a_driver, "A", fake_clock)
    b = consumer(make_driver(fake_clock), "B", fake_clock)
    cancelled: list[str] = []
    active: set[str] = set()
    overlap = [0]

    async def work(params: Any, ctx: TaskContext) -> str:
        active.add(ctx.worker_id)
        overlap[0] = max(overlap[0], len(active))
        try:
            if ctx.worker_id == "A":
                await asyncio.Event().wait()
            return ctx.worker_id
        except asyncio.CancelledError:
            cancelled.append(ctx.worker_id)
            raise
        finally:
            active.discard(ctx.worker_id)

    a.register("job", work)
    b.register("job", work)
    recorder = Recorder(a, b)
    await publisher.send(Task("t1", "job", option=OPTION))
    await a.start()
    await recorder.wait("claimed")
    await advance(fake_clock, 1.0)  # one good ping
    await b.start()
    for op in ("ping", "claim", "expire_leases", "find_wakeups"):  # A is cut off from the store
        a_driver.fail_next(op, times=1000)
    await advance_until(fake_clock, lambda: recorder.counts["finished"] >= 2, step=STEP, limit=60)
    await a.stop(grace=0)
    await b.stop(grace=0)
    assert cancelled == ["A"]
    assert overlap[0] == 1, "A stopped at its lease end, before B took over"
    info = await publisher.get("t1")
    assert [(w.worker_id, w.status.value) for w in info.worker_states] == [("A", "lost"), ("B", "succeeded")]


async def test_transient_storage_errors_never_stop_a_consumer_or_lose_work(
    make_driver, fake_clock: FakeClock
) -> None:
    """Every operation of two consumers fails now and then (some after applying): all tasks still
    succeed once, nothing runs twice at once, and neither consumer dies of a transient error."""
    store = make_driver(fake_clock)
    publisher = Publisher(store, clock=fake_clock)
    overlap = Overlap()
    consumers = []
    for worker_id in ("A", "B"):
        driver = FaultyDriver(make_driver(fake_clock))
        c = Consumer(
            as_driver(driver),
            worker_id=worker_id,
            clock=fake_clock,
            poll_interval=POLL,
            concurrency=2,
            heartbeat_interval=1.0,
        )

        async def work(params: Any, ctx: TaskContext) -> int:
            overlap.enter(ctx.key, ctx.worker_id)
            try:
                await fake_clock.sleep(0.5 + params["n"] % 3)
            finally:
                overlap.leave(ctx.key, ctx.worker_id)
            return int(params["n"])

        c.register("job", work)
        consumers.append(c)
    await publisher.send_many([Task(f"t{i}", "job", {"n": i}, option=OPTION) for i in range(30)])
    for n, c in enumerate(consumers):
        await c.start()  # start() reports storage errors to its caller: faults begin once running
        for k, (op, after_apply) in enumerate(
            (
                ("claim", False),
                ("ping", True),
                ("finish", True),
                ("expire_leases", False),
                ("find_wakeups", False),
                ("heartbeat_worker", False),
            )
        ):
            cast(FaultyDriver, c.driver).fail_randomly(op, 0.3, after_apply=after_apply, seed=100 * n + k)

    async def all_done() -> bool:
        counts = await store.count_by_status()
        return counts.get("succeeded", 0) == 30

    await advance_until(fake_clock, all_done, step=STEP, limit=300)
    for c in consumers:
        assert c.error is None, c.error
        await c.stop(grace=0)
    injected = sum(len(cast(FaultyDriver, c.driver).faults) for c in consumers)
    assert injected >= 20, f"only {injected} faults were injected"
    assert max(overlap.peak.values()) == 1, "no task ran twice at once"
    for i in range(30):
        info = await publisher.get(f"t{i}")
        statuses = [w.status.value for w in info.worker_states]
        assert statuses.count("succeeded") == 1 and info.results == [i]
        assert overlap.runs[f"t{i}"] == statuses.count("lost") + 1, "re-run only after a lost attempt"
