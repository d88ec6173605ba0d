"""Issue 18 A (bounded cost on a busy replica set): the queries the driver sends, checked on
mongomock for their shape (what makes a server's planner use an index, and what a server writes),
since mongomock ignores index semantics. Their plans on a real server: tests/real/test_query_plans.py.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import UpdateOne

from benchmarks.limit_bytes import measure
from mscheduler import FakeClock, Publisher, Task, TaskOption
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import ClaimParams, ExpireParams, WakeupParams
from mscheduler.drivers.mongo.common import DEADLINE_INDEX, INDEXES, MAX_SCANS
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.test_mongo_reads_and_sessions import _Session, _SessionCollection

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
UNIQUE_LIVE_FILTER_TYPE = {"$type": "string"}


class Recording(_SessionCollection):
    """Records the filters of the commands it passes on (mongomock ignores sessions)."""

    def __getattr__(self, name: str) -> Any:
        call = super().__getattr__(name)
        if not callable(call):
            return call

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.__dict__.setdefault("sent", []).append((name, args, kwargs))
            return call(*args, **kwargs)

        return recorded

    def find(self, *args: Any, **kwargs: Any) -> Any:
        self.__dict__.setdefault("sent", []).append(("find", args, kwargs))
        kwargs.pop("session", None)
        return self._inner.find(*args, **kwargs)


def unique_live_conditions(value: Any) -> list[Any]:
    """Every condition on ``state.unique_live`` anywhere in a filter."""
    found = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "state.unique_live":
                found.append(v)
            else:
                found.extend(unique_live_conditions(v))
    elif isinstance(value, list):
        for v in value:
            found.extend(unique_live_conditions(v))
    return found


async def test_the_transactional_upsert_states_the_type_of_the_partial_unique_index() -> None:
    """Item 1: ``{state.unique_live: h}`` cannot use the ``$type``-partial index (the planner
    cannot prove an equality on a string is a string), so each unique task of a send inside a
    transaction scanned the collection. Every unique_live condition the driver sends says
    ``$type: "string"``."""
    driver = MongoDriver(mongomock_database(), create_indexes=True)
    await driver.setup()
    recording = Recording(driver.tasks)
    driver.tasks = driver.tasks_primary = driver.tasks_recovery = recording
    publisher = Publisher(driver, clock=FakeClock(NOW))
    await publisher.send(Task("a", "job", {"n": 1}, unique_by="params"), session=_Session())
    await publisher.send(Task("b", "job", {"n": 1}, unique_by="params"), session=_Session())
    ops = [op for name, args, _ in recording.sent if name == "bulk_write" for op in args[0]]
    assert ops and all(isinstance(op, UpdateOne) for op in ops)
    conditions = [c for op in ops for c in unique_live_conditions(op._filter)]
    assert len(conditions) == 2
    assert all(isinstance(c, dict) and c.get("$type") == "string" for c in conditions), conditions
    assert await driver.get_task("b") is None, "b's params are a's: not created"
    assert await driver._unique_holder_of("a") == "a"
    reads = [args[0] for name, args, _ in recording.sent if name in ("find", "find_one")]
    conditions = [c for f in reads for c in unique_live_conditions(f)]
    assert conditions and all(isinstance(c, dict) and c.get("$type") == "string" for c in conditions)


async def test_the_deadline_pass_is_served_by_an_index_that_leads_with_the_status() -> None:
    """Item 5: the deadline index was (deadline, status): the pass's range on the deadline came
    first, so it read a key per past deadline of any status, finished ones included. The index is
    (status, deadline): an equality on ``pending``, then the range."""
    driver = MongoDriver(mongomock_database())
    await driver.setup()
    keys = {options["name"]: keys for keys, options in INDEXES}
    assert keys[DEADLINE_INDEX] == [("part", 1), ("state.status", 1), ("option.deadline", 1)]
    assert DEADLINE_INDEX in set(await driver.index_names())
    await Publisher(driver, clock=FakeClock(NOW)).send(
        Task("t", "job", option=TaskOption(deadline=NOW + LEASE))
    )
    # the pass names that index
    recording = Recording(driver.tasks)
    driver.tasks = recording
    await driver.expire_deadlines(ExpireParams(NOW + 2 * LEASE))
    (update,) = [kwargs for name, _, kwargs in recording.sent if name == "update_many"]
    assert update.get("hint") == DEADLINE_INDEX


# -- item 2: a limit write costs the same bytes at 10 slots and at 10,000 --------------------------


async def test_a_limit_write_logs_and_returns_as_many_bytes_at_a_thousand_slots_as_at_ten() -> None:
    """Item 2: each acquire, extension and release rewrote the slots and starts arrays; removing
    an element shifted every later one, so the server logged the whole document (and returned
    it): at 10,000 slots ~0.4 MB of oplog per acquire or release. Slots are fields now, rate
    starts counters per time bucket, replies projected: the oplog delta and the reply of each
    write do not grow with the limit (benchmarks/limit_bytes.py has the table up to 10,000)."""
    small, large = await measure(10), await measure(1000)
    for write in ("acquire", "extend", "release"):
        a, b = small["writes"][write], large["writes"][write]
        assert b["oplog_kind"] == "delta", (write, b)
        assert b["oplog"] <= a["oplog"] + 16, (write, a, b)
        assert b["reply"] <= a["reply"] + 16, (write, a, b)
        assert b["command"] == a["command"], (write, a, b)
    assert large["writes"]["acquire"]["document"] > 50 * small["writes"]["acquire"]["document"]


async def test_no_claim_or_wakeup_query_merges_more_than_two_hundred_ranges() -> None:
    """18.4: a claim and a poll send at most ``MAX_SCANS`` (200) claimer tokens per query: above
    ``internalQueryMaxScansToExplode`` (200) the server sorts every due task of every token in
    memory, each claim and each poll. 300 names are 600 tokens: three chunks."""
    driver = MongoDriver(mongomock_database(), create_indexes=True)
    await driver.setup()
    names = [f"n{i:03}" for i in range(300)]
    await Publisher(driver, clock=FakeClock(NOW)).send_many([Task(f"t{i}", names[i * 7]) for i in range(40)])
    recording = Recording(driver.tasks)
    driver.tasks = recording
    await driver.find_wakeups(WakeupParams("w1", names, NOW, 100))
    claimed = await driver.claim(ClaimParams("w1", names, NOW, [f"a{i}" for i in range(10)], LEASE))
    assert len(claimed) == 10
    sizes = [len(tokens) for _, args, _ in recording.sent for tokens in claimer_conditions(args)]
    assert sizes and max(sizes) <= MAX_SCANS, sizes
    reads = [name for name, _, _ in recording.sent if name == "find"]
    assert len(reads) == 6, "three chunks for the poll, three for the claim's heads"


def claimer_conditions(args: Any) -> list[list[str]]:
    """The token lists of ``state.claimers: {$in: [...]}`` conditions in a command's filter, for
    the filters that say so directly (a pinned claim's $and repeats them: the key index serves it)."""
    found = []
    filter_ = args[0] if args and isinstance(args[0], dict) else {}
    condition = filter_.get("state.claimers")
    if isinstance(condition, dict) and "$in" in condition:
        found.append(condition["$in"])
    return found


class _Concurrency:
    """Counts the claims (findAndModify) in flight at once."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.now = self.most = 0

    async def find_one_and_update(self, *args: Any, **kwargs: Any) -> Any:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.001)
            return await self._inner.find_one_and_update(*args, **kwargs)
        finally:
            self.now -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_claim_of_many_attempts_keeps_a_few_in_flight() -> None:
    """18.3: a consumer's claim of 64 attempts sent 64 findAndModify at once, every one sorting
    to the same head document: the losers conflict and the server runs them again (wasted work
    growing with the square of the claimers). At most ``max_parallel_claims`` (8) are in flight."""
    driver = MongoDriver(mongomock_database(), create_indexes=True)
    await driver.setup()
    await Publisher(driver, clock=FakeClock(NOW)).send_many([Task(f"t{i}", "job") for i in range(100)])
    counting = _Concurrency(driver.tasks)
    driver.tasks = counting
    claimed = await driver.claim(ClaimParams("w1", ["job"], NOW, [f"a{i}" for i in range(64)], LEASE))
    assert len(claimed) == 64
    assert counting.most <= 8, f"{counting.most} claims in flight at once"


def test_the_busy_workers_are_computed_once_per_write_not_per_named_worker() -> None:
    """18.8: ``state.claimers`` of a task aimed at W workers with E entries recomputed the busy
    workers (a $map over the entries) inside the $filter over the named workers: O(W x E) per
    write. It is a $let now: the filter's condition reads a variable."""
    from mscheduler.drivers.mongo.common import claimers_expression

    def filters_over_named_workers(value: Any) -> list[dict[str, Any]]:
        found = []
        if isinstance(value, dict):
            if value.get("$filter", {}).get("input") == "$option.specific_worker_ids":
                found.append(value["$filter"])
            for v in value.values():
                found += filters_over_named_workers(v)
        elif isinstance(value, list):
            for v in value:
                found += filters_over_named_workers(v)
        return found

    (over_workers,) = filters_over_named_workers(claimers_expression())
    assert "$map" not in str(over_workers["cond"]) and "$$busy" in str(over_workers["cond"])


async def test_the_operators_reads_are_bounded_in_time_and_not_retried_past_it() -> None:
    """18.8: no maxTimeMS on the operators' reads: a statistics window over millions of tasks or
    a deep skip ran on. Listings, counts, statistics, events, plans, workers and limits carry
    ``maxTimeMS``; past it the server's refusal (50) is an error at once, not retried."""
    from mscheduler.domain.listing import ListParams
    from mscheduler.drivers.base import StatsParams
    from mscheduler.drivers.mongo.common import ADMIN_READ_MS
    from tests.scenarios.test_mongo_retries import FailingCursor, FlakyCollection

    driver = MongoDriver(mongomock_database(), create_indexes=True)
    await driver.setup()
    await Publisher(driver, clock=FakeClock(NOW)).send(Task("t", "job"))
    sent: list[Any] = []

    class Timed(FlakyCollection):
        def find(self, *args: Any, **kwargs: Any) -> Any:
            cursor = super().find(*args, **kwargs)
            if isinstance(cursor, FailingCursor):
                return cursor
            original = cursor.max_time_ms

            def max_time_ms(ms: int) -> Any:
                sent.append(("find", ms))
                return original(ms)

            cursor.max_time_ms = max_time_ms
            return cursor

        def aggregate(self, *args: Any, **kwargs: Any) -> Any:
            sent.append(("aggregate", kwargs.get("maxTimeMS")))
            return self._inner.aggregate(*args, **kwargs)

    timed = Timed(driver.tasks)
    driver.tasks = driver.tasks_primary = timed
    await driver.list_tasks(ListParams())
    await driver.count_by_status()
    await driver.task_stats(StatsParams(NOW, timedelta(hours=1)))
    assert sent == [("find", ADMIN_READ_MS)] + [("aggregate", ADMIN_READ_MS)] * 3
    from pymongo.errors import ExecutionTimeout

    timed.fail("find", ExecutionTimeout("operation exceeded time limit", code=50))
    try:
        await driver.list_tasks(ListParams())
    except StorageError as exc:
        assert not exc.transient and "maxTimeMS" in str(exc)
    else:
        raise AssertionError("a read past its time is an error")
    assert timed.calls["find"] == 2, "not retried"


def test_statistics_push_one_entry_per_distinct_duration_not_per_attempt() -> None:
    """18.8: the percentiles' $group pushed every succeeded attempt's duration of a name (past
    100 MB on a busy name, the stage fails). The durations are counted per distinct value first;
    the ranks are found by a running count (``$reduce``; exact: the conformance suite checks the
    numbers, on the stand-in and on a real server)."""
    from mscheduler.drivers.base import StatsParams
    from mscheduler.drivers.mongo.stats import finished_pipeline

    params = StatsParams(NOW, timedelta(hours=1))
    facet = finished_pipeline(params)[-1]["$facet"]["durations"]
    pushes = [stage["$group"] for stage in facet if "$group" in stage]
    assert pushes[0]["_id"] == {"name": "$name", "d": "$ok"}, "first counted per distinct duration"
    assert pushes[1]["h"] == {"$push": {"d": "$_id.d", "c": "$c"}}
    assert "$push" not in str(pushes[0])
