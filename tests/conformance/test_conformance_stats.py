"""task_stats (SPEC F27): both drivers give the hand-computed numbers of one crafted store."""

from __future__ import annotations

from datetime import timedelta

from mscheduler.domain.model import TaskStatus
from mscheduler.domain.stats import COUNT_STEP, WINDOW_STEP
from mscheduler.drivers.base import ControlParams, NewTask, StatsParams
from tests.conformance.support import Store

MINUTE = 60


async def _run(store: Store, key: str, name: str, outcomes: list[tuple[float, str]]) -> None:
    """Claim ``key`` once per outcome: each attempt runs ``seconds``, then ends ``outcome``
    (``lost``: its lease runs out and ``expire_leases`` marks it)."""
    for seconds, outcome in outcomes:
        claimed = await store.claim_one(f"w-{key}", names=[name])
        assert claimed is not None and claimed.key == key
        store.advance(seconds)
        if outcome == "lost":
            assert await store.expire() == 1
        elif outcome == "succeeded":
            assert await store.done(claimed, f"w-{key}")
        else:
            assert await store.fail(claimed, f"w-{key}", retry_in=0)


async def _control(store: Store, key: str, action: str) -> None:
    params = ControlParams(key, action, ("pending", "running"), store.now)
    assert await store.driver.control_task(params)


async def test_stats_of_a_crafted_store(store: Store) -> None:
    t0 = store.now  # 2030-01-01 00:00 UTC: a whole minute
    tasks: list[NewTask] = []

    def add(key: str, name: str, **option: object) -> None:
        option.setdefault("specific_worker_ids", (f"w-{key}",))  # claimed only by its own worker
        tasks.append(store.task(key, name, **option))

    for key in ("a-old", "a-mid", "a1", "a2", "a3", "a4", "a5", "a-second", "a-retry"):
        add(key, "a")
    add("a-late", "a", run_at=t0 + timedelta(minutes=69))
    add("b-failed", "b", max_unexpected_retries=0)
    add("b-lost", "b", max_unexpected_retries=0)
    for key in ("b-third", "b-cancelled", "b-due", "b-paused", "b-running"):
        add(key, "b")
    add("b-future", "b", run_at=t0 + timedelta(hours=2))
    assert all(await store.insert(*tasks))
    await _control(store, "b-paused", "pause")  # due since t0, but paused: not waiting

    async def at_minute(minute: float) -> None:
        store.advance((t0 + timedelta(minutes=minute) - store.now).total_seconds())

    await _run(store, "a-old", "a", [(1, "succeeded")])  # ends at 0:01, before the hour
    await at_minute(20)
    await _run(store, "a-mid", "a", [(2, "succeeded")])  # 20:02, in the hour, not in the window
    for n, seconds in enumerate((1, 2, 3, 4, 10), start=1):  # 41:01, 42:02, ... 45:10
        await at_minute(40 + n)
        await _run(store, f"a{n}", "a", [(seconds, "succeeded")])
    await at_minute(46)
    await _run(store, "a-second", "a", [(1, "failed"), (5, "succeeded")])  # 46:06
    await at_minute(47)
    await _run(store, "b-failed", "b", [(3, "failed")])  # 47:03, budget 0: failed
    await at_minute(48)
    await _run(store, "b-lost", "b", [(31, "lost")])  # 48:31, lease of 30 s: lost, failed
    await at_minute(49)
    await _run(store, "b-third", "b", [(1, "failed"), (1, "failed"), (2, "succeeded")])  # 49:04
    await at_minute(50)
    await _control(store, "b-cancelled", "cancel")  # terminal, but not "finished"
    await at_minute(65)
    claimed = await store.claim_one("w-a-retry", names=["a"])
    assert claimed is not None
    store.advance(1)
    assert await store.fail(claimed, "w-a-retry", retry_in=120)  # due again at 67:01
    await at_minute(69 + 50 / 60)
    assert await store.claim_one("w-b-running", names=["b"]) is not None
    await at_minute(70)

    stats = await store.driver.task_stats(StatsParams(store.now, timedelta(minutes=30)))

    zero = {s.value: 0 for s in TaskStatus}
    by_name = {n.name: n for n in stats.names}
    assert by_name["a"].counts == zero | {"succeeded": 8, "pending": 2}
    assert by_name["b"].counts == zero | {
        "succeeded": 1,
        "failed": 2,
        "cancelled": 1,
        "pending": 3,
        "running": 1,
    }
    assert stats.counts == zero | {"succeeded": 9, "failed": 2, "cancelled": 1, "pending": 5, "running": 1}
    assert stats.total == 18

    # the window is 40:00 .. 70:00
    a, b = by_name["a"], by_name["b"]
    assert (a.finished, a.succeeded, a.failed) == (6, 6, 0)
    assert (a.first_attempt_successes, a.second_attempt_successes) == (5, 1)
    assert (b.finished, b.succeeded, b.failed) == (3, 1, 2)
    assert (b.first_attempt_successes, b.second_attempt_successes) == (0, 0)  # b-third: 3rd
    assert (stats.finished, stats.succeeded, stats.failed) == (9, 7, 2)
    assert stats.first_attempt_success_rate == 5 / 9
    assert stats.second_attempt_success_rate == 1 / 9
    assert a.first_attempt_success_rate == 5 / 6 and b.second_attempt_success_rate == 0

    # durations of succeeded attempts: a [1, 2, 3, 4, 5, 10] -> ranks 3 and 6; b [2]
    assert (a.succeeded_attempts, a.duration_p50, a.duration_p95) == (6, 3.0, 10.0)
    assert (b.succeeded_attempts, b.duration_p50, b.duration_p95) == (1, 2.0, 2.0)

    # oldest due pending: a-retry due 67:01 (a-late 69:00); b-due since 0:00 (b-paused and
    # b-future do not count)
    assert a.oldest_pending_age == 179.0
    assert b.oldest_pending_age == 70 * MINUTE
    assert stats.oldest_pending_age == 70 * MINUTE

    # throughput: minutes 11:00 .. 70:00 (the current one last)
    assert len(stats.throughput) == 60
    assert stats.throughput[0].start == t0 + timedelta(minutes=11)
    assert stats.throughput[-1].start == t0 + timedelta(minutes=70)
    buckets = enumerate(stats.throughput)
    counts = {i: (bk.succeeded, bk.failed) for i, bk in buckets if bk.succeeded or bk.failed}
    assert counts == {
        9: (1, 0),  # a-mid 20:02
        30: (1, 0),
        31: (1, 0),
        32: (1, 0),
        33: (1, 0),
        34: (1, 0),  # a1 .. a5
        35: (1, 0),  # a-second
        36: (0, 1),  # b-failed
        37: (0, 1),  # b-lost
        38: (1, 0),  # b-third
    }


async def test_stats_restricted_to_names_statuses_or_without_a_window(store: Store) -> None:
    await store.add("x1", "x")
    await store.add("y1", "y")
    done = await store.claim_one("w", names=["x"])
    assert done is not None
    store.advance(2)
    assert await store.done(done, "w")
    await store.add("x2", "x")
    store.advance(5)

    only_x = await store.driver.task_stats(StatsParams(store.now, timedelta(hours=1), names=["x"]))
    assert [n.name for n in only_x.names] == ["x"]
    assert only_x.counts["succeeded"] == 1 and only_x.counts["pending"] == 1
    assert only_x.names[0].duration_p50 == 2.0 and only_x.names[0].oldest_pending_age == 5.0

    live = await store.driver.task_stats(StatsParams(store.now, statuses=["pending", "running"]))
    assert live.counts == {"pending": 2, "running": 0} and live.window_seconds is None
    assert {n.name: n.counts["pending"] for n in live.names} == {"x": 1, "y": 1}
    assert live.finished == 0 and live.throughput == [] and live.first_attempt_success_rate is None
    assert live.oldest_pending_age == 7.0  # y1, due since the start

    empty = await store.driver.task_stats(StatsParams(store.now, timedelta(hours=1), names=["nothing"]))
    assert empty.names == [] and empty.total == 0 and empty.oldest_pending_age is None
    assert sum(bk.succeeded + bk.failed for bk in empty.throughput) == 0


async def test_stats_tell_each_read_before_it_runs(store: Store) -> None:
    """``on_step`` names the phase before each read of the store (what ``mscheduler stats``
    shows while a large store computes): the counts first, the window's tasks when asked."""
    await store.add("x1", "x")
    steps: list[str] = []
    counted = await store.driver.task_stats(StatsParams(store.now), steps.append)
    assert counted.total == 1 and steps and steps[0].startswith(COUNT_STEP)
    assert not any(WINDOW_STEP in step for step in steps), "no window asked: nothing read for it"

    steps.clear()
    await store.driver.task_stats(StatsParams(store.now, timedelta(hours=1)), steps.append)
    assert steps[0].startswith(COUNT_STEP) and WINDOW_STEP in steps[-1]
