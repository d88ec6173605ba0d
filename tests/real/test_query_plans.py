"""Query plans on a real server (issue 6: A2, A3, A9, A10).

With a backlog of more than 10,000 tasks (due tasks of several names, 10,000 tasks aimed at a
worker that never comes, finished tasks, running tasks, tasks due tomorrow), every scheduler query
must use the index it names, with no collection scan and no in-memory SORT (a SORT_MERGE of index
ranges is fine), and read a number of keys and documents bounded by what it returns, not by the
backlog.

The commands explained are exactly the ones the driver sends: each operation runs once against
empty scratch collections (a second ``MongoDriver`` on the same database with another prefix)
while a PyMongo command listener records the command that went over the wire; that command,
pointed at the backlog's collection, is then explained with ``executionStats``. Nothing is
re-typed here: a change to a filter, sort, hint or update is explained as the driver sends it.
"""

from __future__ import annotations

import copy
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from pymongo import AsyncMongoClient, monitoring

from mscheduler import Child, FakeClock, MongoDriver, Publisher, Task, TaskOption
from mscheduler.domain.listing import ListParams, encode_cursor, list_params
from mscheduler.domain.model import TaskInfo
from mscheduler.domain.state import TERMINAL, claimer_tokens
from mscheduler.drivers.base import (
    ClaimParams,
    ControlParams,
    ExpireParams,
    FinishParams,
    InsertParams,
    KeyWaitParams,
    LaneParams,
    NewTask,
    PingParams,
    PurgeParams,
    SyncParentsParams,
    WakeupParams,
)
from mscheduler.drivers.mongo.common import (
    ALL_STATUSES,
    ATTEMPT_INDEX,
    ATTEMPTS_INDEX,
    CLAIM_INDEX,
    CREATED_INDEX,
    FINISHED_INDEX,
    GROUP_INDEX,
    KEY_INDEX,
    LANES_INDEX,
    LEASES_HISTORY_INDEX,
    LEASES_INDEX,
    NAME_INDEX,
    STATUS_INDEX,
    UPDATED_INDEX,
    WAKEUP_INDEX,
    WORKER_INDEX,
)
from tests.conftest import REAL_URI

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)"),
    # one backlog for the module: the tests share its event loop
    pytest.mark.asyncio(loop_scope="module"),
]

T0 = datetime(2030, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(seconds=10)  # when the explained queries run
NAMES = ("alpha", "beta")  # what WORKER handles
OTHER = "gamma"  # a name WORKER does not handle
WORKER = "w-present"
ABSENT = "w-absent"  # never runs: 10,000 tasks wait for it
FINISHER = "w-finisher"  # ran the finished tasks
DEAD = "w-dead"  # claimed tasks with short leases and died
TARGETED_AT_ABSENT = 10_000
GROUP = "g-nobody"  # no worker of these tests is in it: 150 tasks wait for its members
SCRATCH_PREFIX = "explain_scratch_"
LEASE = timedelta(seconds=30)

# Arguments every command may carry that are not part of what is explained (and that explain
# refuses inside the explained command): sessions, transactions, write / read concerns, routing.
GENERIC_ARGUMENTS = frozenset(
    {
        "$db",
        "$clusterTime",
        "$readPreference",
        "lsid",
        "txnNumber",
        "autocommit",
        "startTransaction",
        "writeConcern",
        "readConcern",
        "maxTimeMS",
        "apiVersion",
        "apiStrict",
        "apiDeprecationErrors",
    }
)
SCAN_STAGES = frozenset({"IXSCAN", "EXPRESS_IXSCAN", "COUNT_SCAN", "DISTINCT_SCAN"})
IN_MEMORY_SORTS = frozenset({"SORT"})  # SORT_MERGE (a merge of sorted index ranges) is fine
ID_INDEX = "_id_"


# -- recording the driver's commands -------------------------------------------------------------


class CommandRecorder(monitoring.CommandListener):
    """Keeps a copy of every command sent about the collection named ``collection``."""

    def __init__(self) -> None:
        self.collection: str | None = None
        self.commands: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        command = dict(event.command)
        if self.collection is not None and command.get(event.command_name) == self.collection:
            self.commands.append(copy.deepcopy(command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


# -- reading explain output ----------------------------------------------------------------------


def _dicts_under(value: Any, key: str) -> Iterator[dict[str, Any]]:
    """Every dict stored under ``key`` anywhere in ``value``, breadth first; rejected plans
    (none with a hint, but never counted) are skipped."""
    queue: list[Any] = [value]
    while queue:
        item = queue.pop(0)
        if isinstance(item, Mapping):
            for k, v in item.items():
                if k == "rejectedPlans":
                    continue
                if k == key and isinstance(v, Mapping):
                    yield dict(v)
                queue.append(v)
        elif isinstance(item, list):
            queue.extend(item)


def plan_stages(explain: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stages of every winning plan in an explain reply, as a flat list.

    Handles the classic engine (``winningPlan`` is the plan tree), the slot-based engine
    (``winningPlan.queryPlan``) and aggregations (the plan under ``stages[0].$cursor``, or at
    the top when the whole pipeline was pushed down). A stage is any dict with a ``stage`` name;
    its children (``inputStage``, ``inputStages``, ...) are walked whatever their key.
    """
    stages: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if isinstance(node.get("stage"), str):
                stages.append(dict(node))
            for k, v in node.items():
                if k not in ("filter", "indexBounds", "keyPattern", "multiKeyPaths", "parsedQuery"):
                    walk(v)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for winning in _dicts_under(explain, "winningPlan"):
        walk(winning.get("queryPlan", winning))
    return stages


@dataclass(frozen=True)
class Plan:
    stages: list[str]
    indexes: set[str]
    keys: int
    docs: int
    returned: int | None
    raw: dict[str, Any] = field(repr=False)

    def summary(self) -> str:
        return f"stages={self.stages} indexes={sorted(self.indexes)} keys={self.keys} docs={self.docs}"


def read_plan(explain: Mapping[str, Any]) -> Plan:
    stages = plan_stages(explain)
    assert stages, f"no winning plan in the explain reply: {explain}"
    stats = next((s for s in _dicts_under(explain, "executionStats") if "totalKeysExamined" in s), None)
    assert stats is not None, f"no executionStats in the explain reply: {explain}"
    assert stats.get("executionSuccess", True), f"the explained command failed: {stats}"
    return Plan(
        stages=[s["stage"] for s in stages],
        indexes={str(s.get("indexName")) for s in stages if s["stage"] in SCAN_STAGES},
        keys=int(stats["totalKeysExamined"]),
        docs=int(stats["totalDocsExamined"]),
        returned=stats.get("nReturned"),
        raw=dict(explain),
    )


def assert_plan(plan: Plan, index: str, *, max_keys: int, max_docs: int, what: str) -> None:
    assert "COLLSCAN" not in plan.stages, f"{what}: a collection scan: {plan.summary()}"
    assert not IN_MEMORY_SORTS.intersection(plan.stages), f"{what}: an in-memory sort: {plan.summary()}"
    assert plan.indexes == {index}, f"{what}: expected only the index {index!r}: {plan.summary()}"
    assert plan.keys <= max_keys, f"{what}: read {plan.keys} keys (at most {max_keys}): {plan.summary()}"
    assert plan.docs <= max_docs, f"{what}: read {plan.docs} documents (at most {max_docs}): {plan.summary()}"


# -- the backlog ---------------------------------------------------------------------------------


@dataclass
class Backlog:
    database: Any
    driver: MongoDriver  # over the backlog
    scratch: MongoDriver  # same database, other (empty) collections: where commands are recorded
    recorder: CommandRecorder
    running: dict[str, str]  # key -> attempt of WORKER's running attempts (leases end T0 + 30 s)
    expired: int  # running entries of DEAD whose lease ended before NOW

    async def command_of(
        self, name: str, operation: Callable[[MongoDriver], Awaitable[Any]]
    ) -> dict[str, Any]:
        """Run ``operation`` on the scratch driver; the last ``name`` command it sent."""
        return (await self.commands_of(name, operation))[-1]

    async def commands_of(
        self, name: str, operation: Callable[[MongoDriver], Awaitable[Any]]
    ) -> list[dict[str, Any]]:
        """Run ``operation`` on the scratch driver; every ``name`` command it sent, in order."""
        self.recorder.collection = self.scratch.tasks.name
        self.recorder.commands.clear()
        try:
            await operation(self.scratch)
        finally:
            self.recorder.collection = None
        sent = [c for c in self.recorder.commands if next(iter(c)) == name]
        assert sent, (
            f"the operation sent no {name!r} command: {[next(iter(c)) for c in self.recorder.commands]}"
        )
        return sent

    async def explain(self, command: Mapping[str, Any]) -> Plan:
        """``command`` as the driver sent it, run against the backlog, with executionStats."""
        explained = {k: v for k, v in command.items() if k not in GENERIC_ARGUMENTS}
        explained[next(iter(explained))] = self.driver.tasks.name
        reply = await self.database.command({"explain": explained, "verbosity": "executionStats"})
        return read_plan(reply)

    async def plan_of(self, name: str, operation: Callable[[MongoDriver], Awaitable[Any]]) -> Plan:
        return await self.explain(await self.command_of(name, operation))

    async def count(self) -> int:
        return int(await self.driver.tasks.count_documents({}))


def attempts(n: int) -> list[str]:
    return [secrets.token_hex(8) for _ in range(n)]


async def claim_all(driver: MongoDriver, worker: str, names: Sequence[str], now: datetime) -> dict[str, str]:
    """Claim every task ``worker`` may claim at ``now``; key -> attempt."""
    claimed: dict[str, str] = {}
    while True:
        batch = await driver.claim(ClaimParams(worker, list(names), now, attempts(50)))
        if not batch:
            return claimed
        claimed.update({c.key: c.attempt for c in batch})


async def build_backlog(driver: MongoDriver) -> tuple[dict[str, str], int]:
    """Fill the store; returns WORKER's running attempts and how many leases have expired by NOW.

    Tasks that must end up claimed are sent first and claimed while nothing else of their name
    exists, so that each claim takes exactly them.
    """
    publisher = Publisher(driver, clock=FakeClock(T0))
    short = TaskOption(ping_interval=timedelta(seconds=1), worker_timeout=timedelta(seconds=2))

    # finished: 300 succeeded, 100 failed for good (no retries allowed)
    await publisher.send_many(
        [Task(f"done-ok-{i:04}", "alpha") for i in range(300)]
        + [
            Task(f"done-failed-{i:04}", "alpha", option=TaskOption(max_unexpected_retries=0))
            for i in range(100)
        ]
    )
    finished = await claim_all(driver, FINISHER, ["alpha"], T0)
    assert len(finished) == 400
    outcomes = [
        FinishParams(key, FINISHER, attempt, T0 + timedelta(seconds=1), "succeeded", result={"ok": True})
        if key.startswith("done-ok-")
        else FinishParams(
            key,
            FINISHER,
            attempt,
            T0 + timedelta(seconds=1),
            "failed",
            error={"type": "RuntimeError", "message": "boom", "traceback": None},
            retry_at=T0 + timedelta(seconds=11),
        )
        for key, attempt in finished.items()
    ]
    assert all(await driver.finish(outcomes))

    # running: 50 held by WORKER (leases end T0 + 30 s, after NOW)
    await publisher.send_many([Task(f"run-{i:04}", "beta") for i in range(50)])
    running = await claim_all(driver, WORKER, ["beta"], T0)
    assert len(running) == 50

    # running with expired leases: 10 held by DEAD (leases ended at T0 + 2 s, before NOW)
    await publisher.send_many([Task(f"dead-{i:04}", OTHER, option=short) for i in range(10)])
    dead = await claim_all(driver, DEAD, [OTHER], T0)
    assert len(dead) == 10

    # due, untargeted: 300 per name, three priorities
    await publisher.send_many(
        [
            Task(f"due-{name}-{i:04}", name, option=TaskOption(priority=i % 3))
            for name in (*NAMES, OTHER)
            for i in range(300)
        ]
    )
    # due, aimed at a worker that never comes, and ahead of everything in the claim order
    await publisher.send_many(
        [
            Task(f"absent-{i:05}", "alpha", option=TaskOption(priority=9, specific_worker_ids=(ABSENT,)))
            for i in range(TARGETED_AT_ABSENT)
        ]
    )
    # due, aimed at a group none of these workers is in (the group listing's partial index)
    await publisher.send_many(
        [Task(f"grp-{i:04}", "beta", option=TaskOption(specific_groups=(GROUP,))) for i in range(150)]
    )
    # due, aimed at WORKER
    await publisher.send_many(
        [Task(f"mine-{i:04}", "beta", option=TaskOption(specific_worker_ids=(WORKER,))) for i in range(20)]
    )
    # due tomorrow, some ahead of everything in the claim order
    tomorrow = T0 + timedelta(days=1)
    await publisher.send_many(
        [
            Task(f"later-{name}-{i:04}", name, option=TaskOption(run_at=tomorrow, priority=priority))
            for name, priority in (("alpha", 9), ("beta", 0))
            for i in range(500)
        ]
    )
    return running, len(dead)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backlog() -> AsyncIterator[Backlog]:
    recorder = CommandRecorder()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(REAL_URI, event_listeners=[recorder])
    database = client[f"mscheduler_plans_{uuid.uuid4().hex[:8]}"]
    try:
        driver = MongoDriver(database)
        await driver.setup()
        scratch = MongoDriver(database, prefix=SCRATCH_PREFIX)
        await scratch.setup()  # the hinted indexes must exist where the commands are recorded
        running, expired = await build_backlog(driver)
        yield Backlog(database, driver, scratch, recorder, running, expired)
    finally:
        await client.drop_database(database.name)
        await client.close()


# -- the claim -----------------------------------------------------------------------------------


def claim_params(exclude: Sequence[str] = ()) -> ClaimParams:
    return ClaimParams(WORKER, list(NAMES), NOW, attempts(1), host="h", pid=1, exclude_keys=list(exclude))


async def test_the_claim_reads_a_bounded_range_of_the_claim_index(backlog: Backlog) -> None:
    """A3: the claim is one findAndModify on the claim index; the 10,000 tasks aimed at an absent
    worker (first in the claim order) and the tasks due tomorrow are outside its ranges."""
    tokens = claimer_tokens(list(NAMES), WORKER)
    commands = {
        "claim": await backlog.command_of("findAndModify", lambda d: d.claim(claim_params())),
        "claim excluding the running keys": await backlog.command_of(
            "findAndModify", lambda d: d.claim(claim_params(sorted(backlog.running)))
        ),
    }
    before = {}
    for what, command in commands.items():
        assert command.get("hint") == CLAIM_INDEX
        plan = await backlog.explain(command)
        # one index range per claimer token, merged in claim order; one document fetched
        assert_plan(plan, CLAIM_INDEX, max_keys=4 * len(tokens) + 4, max_docs=3, what=what)
        assert "UPDATE" in plan.stages, f"{what}: not an update plan: {plan.summary()}"
        before[what] = (plan.keys, plan.docs)

    # Another 10,000 tasks aimed at another absent worker, ahead of everything: the claim does
    # not read one more key or document.
    await Publisher(backlog.driver, clock=FakeClock(T0)).send_many(
        [
            Task(f"absent2-{i:05}", "alpha", option=TaskOption(priority=10, specific_worker_ids=("w-gone",)))
            for i in range(TARGETED_AT_ABSENT)
        ]
    )
    for what, command in commands.items():
        plan = await backlog.explain(command)
        assert (plan.keys, plan.docs) == before[what], (
            f"{what}: the cost grew with the backlog: {before[what]} -> {plan.summary()}"
        )


# -- discovery, leases, pings --------------------------------------------------------------------


async def test_the_wakeup_query_merges_index_ranges_and_stops_at_its_limit(backlog: Backlog) -> None:
    """A2: wake-ups come from the wake-up index in claim_at order (a SORT_MERGE of the claimer
    tokens' ranges, no in-memory sort), reading about ``limit`` keys whatever the backlog."""
    tokens = claimer_tokens(list(NAMES), WORKER)
    limit = 100
    command = await backlog.command_of(
        "find", lambda d: d.find_wakeups(WakeupParams(WORKER, list(NAMES), NOW, limit))
    )
    assert command.get("hint") == WAKEUP_INDEX
    plan = await backlog.explain(command)
    assert_plan(
        plan,
        WAKEUP_INDEX,
        max_keys=limit + 2 * len(tokens) + 2,
        max_docs=limit + len(tokens),
        what="find_wakeups",
    )
    assert plan.returned == limit, plan.summary()


def _hinted(commands: Sequence[Mapping[str, Any]], index: str) -> dict[str, Any]:
    """The one update command among ``commands`` whose update names ``index``."""
    (command,) = [c for c in commands if c["updates"][0].get("hint") == index]
    return dict(command)


async def test_lease_expiry_reads_only_the_expired_entries(backlog: Backlog) -> None:
    """A2: expire_leases is one update on the leases index, bounded on both the status and the
    expiry time: the live leases, the finished entries and the pending tasks are not read."""
    commands = await backlog.commands_of("update", lambda d: d.expire_leases(ExpireParams(NOW)))
    command = _hinted(commands, LEASES_INDEX)
    (update,) = command["updates"]
    assert update.get("hint") == LEASES_INDEX and update.get("multi") is True
    plan = await backlog.explain(command)
    assert_plan(
        plan,
        LEASES_INDEX,
        max_keys=backlog.expired + 2,
        max_docs=backlog.expired + 1,
        what="expire_leases",
    )
    assert "UPDATE" in plan.stages, plan.summary()

    # before any lease ends: nothing is read at all
    early = T0 + timedelta(seconds=1)
    commands = await backlog.commands_of("update", lambda d: d.expire_leases(ExpireParams(early)))
    plan = await backlog.explain(_hinted(commands, LEASES_INDEX))
    assert_plan(plan, LEASES_INDEX, max_keys=2, max_docs=0, what="expire_leases before any lease ends")


async def test_lease_expiry_of_earlier_generations_reads_only_their_running_entries(
    backlog: Backlog,
) -> None:
    """Issue 17 A2: the lease pass's second update settles running entries left in
    ``state.history`` (by an earlier build's restart) through the partial index
    ``leases_history``, which holds only the documents with one: none in the backlog, so it
    reads nothing; one such document, and it reads that one."""
    commands = await backlog.commands_of("update", lambda d: d.expire_leases(ExpireParams(NOW)))
    command = _hinted(commands, LEASES_HISTORY_INDEX)
    assert command["updates"][0].get("multi") is True
    plan = await backlog.explain(command)
    assert_plan(plan, LEASES_HISTORY_INDEX, max_keys=1, max_docs=0, what="expire history leases (none)")

    # what an earlier build's restart left: a running entry (its lease ended) in the history
    await Publisher(backlog.driver, clock=FakeClock(T0)).send(
        Task(
            "legacy-0000",
            "legacy",
            option=TaskOption(ping_interval=timedelta(seconds=1), worker_timeout=timedelta(seconds=2)),
        )
    )
    assert len(await claim_all(backlog.driver, DEAD, ["legacy"], T0)) == 1
    moved = {"generation": 0, "restart_time": T0, "worker_states": "$state.worker_states"}
    await backlog.driver.tasks.update_one(
        {"key": "legacy-0000"},
        [{"$set": {"state.history": [moved], "state.generation": 1}}, {"$set": {"state.worker_states": []}}],
    )
    plan = await backlog.explain(command)
    assert_plan(plan, LEASES_HISTORY_INDEX, max_keys=3, max_docs=1, what="expire history leases (one)")


def assert_one_task(plan: Plan, indexes: set[str], what: str) -> None:
    """A write of one task found by its key (or its attempt token): no scan, one document."""
    assert "COLLSCAN" not in plan.stages, f"{what}: a collection scan: {plan.summary()}"
    assert plan.indexes and plan.indexes <= indexes, f"{what}: indexes {plan.summary()}"
    assert plan.keys <= 2 and plan.docs <= 1, f"{what}: read too much: {plan.summary()}"


async def test_a_finish_and_its_settlements_read_one_task(backlog: Backlog) -> None:
    """Issue 17 A1: a finish is one update of one task (the key index, or the attempt index),
    whichever outcome it writes: the filter now also says which outcomes a cancel or a stopping
    pause lets through (``state.cancelled``, ``state.stop.attempts``)."""
    key, attempt = sorted(backlog.running.items())[0]
    for outcome in ("succeeded", "released", "cancelled"):
        params = FinishParams(key, WORKER, attempt, NOW, outcome)

        async def finish(driver: MongoDriver, p: FinishParams = params) -> list[bool]:
            return await driver.finish([p])

        command = await backlog.command_of("update", finish)
        plan = await backlog.explain(command)
        # (its filter names the task's _id, the whole shard key with part: _id_ may serve it)
        assert_one_task(plan, {KEY_INDEX, ATTEMPT_INDEX, ID_INDEX}, f"finish {outcome}")


async def test_a_restart_and_a_reset_read_one_task(backlog: Backlog) -> None:
    """Issue 17 A2: a restart (findAndModify) and a reset of a finished task (update) find their
    task by key, with the "no attempt holds a live lease" condition checked on that document."""
    restart = ControlParams("dead-0000", "restart", ("failed", "cancelled", "expired"), NOW)
    command = await backlog.command_of("findAndModify", lambda d: d.control_task(restart))
    assert "$nor" in command["query"]
    assert command["query"]["_id"] == "dead-0000"
    assert_one_task(await backlog.explain(command), {KEY_INDEX, ID_INDEX}, "restart")

    task = NewTask("done-ok-0000", "alpha", None, TaskOption().to_storage(NOW))
    reset = InsertParams([task], NOW, reset_finished=True)
    command = await backlog.command_of("update", lambda d: d.insert_tasks(reset))
    assert "$nor" in command["updates"][0]["q"]
    assert command["updates"][0]["q"]["_id"] == "done-ok-0000"
    assert_one_task(await backlog.explain(command), {KEY_INDEX, ID_INDEX}, "reset")


async def test_the_ping_reads_only_the_pinged_tasks(backlog: Backlog) -> None:
    """The ping is one update on the key index: the keys pinged, nothing else."""
    pinged = len(backlog.running)
    params = PingParams(WORKER, NOW, {NOW + timedelta(seconds=30): dict(backlog.running)})
    command = await backlog.command_of("update", lambda d: d.ping(params))
    (update,) = command["updates"]
    assert update.get("hint") == KEY_INDEX
    plan = await backlog.explain(command)
    # one point interval per key: each key, plus at most the key after it
    assert_plan(plan, KEY_INDEX, max_keys=2 * pinged + 2, max_docs=pinged, what="ping")


# -- admin reads ---------------------------------------------------------------------------------


LISTINGS = [
    pytest.param(ListParams(), CREATED_INDEX, 1, id="all"),
    pytest.param(ListParams(status="pending"), STATUS_INDEX, 1, id="status"),
    # every status listed: one range per status, merged in (create_time, key) order
    pytest.param(ListParams(name="alpha"), NAME_INDEX, len(ALL_STATUSES), id="name"),
    pytest.param(ListParams(name="alpha", status="pending"), NAME_INDEX, 1, id="name-status"),
    # issue 10: a key prefix is a range of the key index; a worker an equality on the multikey
    # worker index; a created range a bound on the created index
    pytest.param(ListParams(key_prefix="due-alpha-"), KEY_INDEX, 1, id="key-prefix"),
    pytest.param(ListParams(worker_id=WORKER, limit=20), WORKER_INDEX, 1, id="worker"),
    pytest.param(ListParams(created_from=T0), CREATED_INDEX, 1, id="created-range"),
    # a finished range: (finish_time, key) order on finished_key, one range per terminal status
    # (merged) or one for a status; a group: an equality on the partial group index
    pytest.param(ListParams(finished_from=T0), FINISHED_INDEX, len(TERMINAL), id="finished-range"),
    pytest.param(ListParams(finished_to=NOW, status="failed"), FINISHED_INDEX, 1, id="finished-range-status"),
    pytest.param(ListParams(group=GROUP), GROUP_INDEX, 1, id="group"),
    pytest.param(ListParams(group=GROUP, status="pending", limit=50), GROUP_INDEX, 1, id="group-status"),
    # issue 20: sorted listings, either way (an index is read backwards as well); updated and
    # attempts merge one range per status, finished one per terminal status
    pytest.param(ListParams(sort="created", descending=True), CREATED_INDEX, 1, id="newest-first"),
    pytest.param(
        ListParams(sort="created", descending=True, name="alpha"),
        NAME_INDEX,
        len(ALL_STATUSES),
        id="newest-name",
    ),
    pytest.param(ListParams(sort="updated"), UPDATED_INDEX, len(ALL_STATUSES), id="sort-updated"),
    pytest.param(
        ListParams(sort="updated", descending=True, status="pending"),
        UPDATED_INDEX,
        1,
        id="sort-updated-status",
    ),
    pytest.param(
        ListParams(sort="attempts", descending=True), ATTEMPTS_INDEX, len(ALL_STATUSES), id="sort-attempts"
    ),
    pytest.param(ListParams(sort="status", descending=True), STATUS_INDEX, 1, id="sort-status"),
    pytest.param(ListParams(sort="name"), NAME_INDEX, 1, id="sort-name"),
    pytest.param(
        ListParams(sort="finished", descending=True), FINISHED_INDEX, len(TERMINAL), id="sort-finished"
    ),
    pytest.param(ListParams(sort="key", descending=True), KEY_INDEX, 1, id="sort-key"),
]


@pytest.mark.parametrize(("params", "index", "ranges"), LISTINGS)
async def test_each_listing_reads_one_page_in_index_order(
    backlog: Backlog, params: ListParams, index: str, ranges: int
) -> None:
    """A9: list_tasks has an index for each filter that also gives its order."""
    command = await backlog.command_of("find", lambda d: d.list_tasks(params))
    assert command.get("hint") == index
    plan = await backlog.explain(command)
    page = params.limit
    assert_plan(
        plan, index, max_keys=page + 2 * ranges + 2, max_docs=page + ranges, what=f"list_tasks {params}"
    )
    assert plan.returned == params.limit, plan.summary()


# A deep page: the cursor of the 500th task (the 200th finished one). Its ``$or`` has one
# branch per sort field, each a tight range of the hinted index, merged in the index's order:
# what the page reads does not grow with its depth, even where thousands of tasks tie on the
# leading field (the backlog's tasks share a few creation times; a status holds thousands).
DEEP_PAGES = [
    pytest.param("created", {}, CREATED_INDEX, 1, id="created"),
    pytest.param("-created", {"status": "pending"}, STATUS_INDEX, 1, id="newest-pending"),
    pytest.param("-updated", {}, UPDATED_INDEX, len(ALL_STATUSES), id="updated"),
    pytest.param("attempts", {}, ATTEMPTS_INDEX, len(ALL_STATUSES), id="attempts"),
    pytest.param("-status", {}, STATUS_INDEX, 1, id="status"),
    pytest.param("name", {}, NAME_INDEX, 1, id="name"),
    pytest.param("-finished", {}, FINISHED_INDEX, len(TERMINAL), id="finished"),
    pytest.param("-key", {}, KEY_INDEX, 1, id="key"),
]


@pytest.mark.parametrize(("sort", "filters", "index", "ranges"), DEEP_PAGES)
async def test_a_deep_page_of_each_order_reads_one_page(
    backlog: Backlog, sort: str, filters: dict[str, Any], index: str, ranges: int
) -> None:
    """Issue 20: sorting and paging by cursor stay index-served at depth (no in-memory SORT)."""
    first = list_params(sort=sort, limit=1000, **filters)
    docs = await backlog.driver.list_tasks(first)
    assert len(docs) >= 300, "the backlog has a few hundred tasks in this listing (400 finished)"
    depth = min(500, len(docs) // 2)
    cursor = encode_cursor(first.order, TaskInfo.from_storage(docs[depth - 1]), descending=first.descending)
    params = list_params(sort=sort, cursor=cursor, limit=100, **filters)
    command = await backlog.command_of("find", lambda d: d.list_tasks(params))
    assert command.get("hint") == index
    plan = await backlog.explain(command)
    order = first.fields
    branches = 1 if first.order == "key" else len(order.rank) + 2
    page = params.limit
    assert_plan(
        plan,
        index,
        max_keys=page + 2 * ranges * branches + 2,
        max_docs=page + ranges * branches,
        what=f"deep page of sort={sort} {filters}",
    )
    assert plan.returned == params.limit, plan.summary()
    expected = [d["key"] for d in docs[depth : depth + 100]]
    assert [d["key"] for d in await backlog.driver.list_tasks(params)] == expected


@pytest.mark.parametrize(
    ("filters", "index"),
    [({"status": "pending"}, STATUS_INDEX), ({"name": "alpha"}, NAME_INDEX), ({}, CREATED_INDEX)],
    ids=["status", "name", "all"],
)
async def test_counting_a_filter_reads_index_keys_up_to_the_cap(
    backlog: Backlog, filters: dict[str, Any], index: str
) -> None:
    """Issue 20: the count a bulk action's confirmation shows is covered by the listing's index
    and stops at its cap."""
    cap = 1000
    params = list_params(**filters)
    command = await backlog.command_of("aggregate", lambda d: d.count_tasks(params, cap))
    assert command.get("hint") == index
    plan = await backlog.explain(command)
    assert_plan(plan, index, max_keys=cap + 2 * len(ALL_STATUSES) + 2, max_docs=0, what=f"count {filters}")
    assert await backlog.driver.count_tasks(params, cap) == cap  # more than the cap match


async def test_counting_by_status_reads_index_keys_only(backlog: Backlog) -> None:
    """A9: count_by_status is covered by the status index: every key once, no document."""
    command = await backlog.command_of("aggregate", lambda d: d.count_by_status())
    assert command.get("hint") == STATUS_INDEX
    plan = await backlog.explain(command)
    total = await backlog.count()
    assert_plan(
        plan,
        STATUS_INDEX,
        max_keys=total + 2 * len(ALL_STATUSES) + 2,
        max_docs=0,
        what="count_by_status",
    )
    assert "FETCH" not in plan.stages, f"count_by_status is not covered: {plan.summary()}"


# -- a known limit -------------------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason=(
        "untargeted fan-out tasks (concurrent_worker_cnt > 1) this worker already ran keep the "
        "'name|*' claimer token while a slot is free, so every claim by this worker fetches and "
        "rejects each of them (the residual $nor of the claim filter): issue 6 A3, second half"
    ),
)
async def test_fan_out_tasks_this_worker_already_ran_do_not_clog_its_claim(backlog: Backlog) -> None:
    name = "fanout"
    publisher = Publisher(backlog.driver, clock=FakeClock(T0))
    await publisher.send_many(
        [
            Task(f"fan-{i:04}", name, option=TaskOption(concurrent_worker_cnt=2, priority=5))
            for i in range(300)
        ]
    )
    ran = await claim_all(backlog.driver, WORKER, [name], T0)
    assert len(ran) == 300
    done = [FinishParams(k, WORKER, a, T0 + timedelta(seconds=1), "succeeded") for k, a in ran.items()]
    assert all(await backlog.driver.finish(done))
    await publisher.send_many([Task(f"fan-free-{i:04}", name) for i in range(10)])

    params = ClaimParams(WORKER, [name], NOW, attempts(1))
    plan = await backlog.plan_of("findAndModify", lambda d: d.claim(params))
    assert_plan(
        plan, CLAIM_INDEX, max_keys=4 * 2 + 4, max_docs=3, what="claim past fan-out tasks already run"
    )


# -- statistics (F27) ----------------------------------------------------------------------------


async def test_stats_read_live_keys_and_only_the_finished_documents(backlog: Backlog) -> None:
    """F27: the metrics' counts (pending, running) are covered by ``stats_counts`` and seek past
    the finished tasks' keys; the window's part fetches only tasks finished in the window."""
    from mscheduler.drivers.base import StatsParams
    from mscheduler.drivers.mongo.common import FINISHED_INDEX, STATS_COUNTS_INDEX

    live = StatsParams(NOW, statuses=("pending", "running"))
    command = await backlog.command_of("aggregate", lambda d: d.task_stats(live))
    assert command.get("hint") == STATS_COUNTS_INDEX
    plan = await backlog.explain(command)
    live_count = await backlog.driver.tasks.count_documents({"state.status": {"$in": ["pending", "running"]}})
    assert_plan(plan, STATS_COUNTS_INDEX, max_keys=live_count + 50, max_docs=0, what="stats counts")
    assert "FETCH" not in plan.stages, f"the stats counts are not covered: {plan.summary()}"

    window = StatsParams(NOW, timedelta(hours=1))
    command = await backlog.command_of("aggregate", lambda d: d.task_stats(window))
    assert command.get("hint") == FINISHED_INDEX
    plan = await backlog.explain(command)
    finished = await backlog.driver.tasks.count_documents({"state.finish_time": {"$ne": None}})
    total = await backlog.count()
    assert finished < total // 10  # the backlog is mostly live tasks: a scan would show
    assert_plan(plan, FINISHED_INDEX, max_keys=finished + 2, max_docs=finished, what="stats window")


# -- issue 18 A: bounded cost on a busy replica set ---------------------------------------------


def assert_indexes_only(plan: Plan, indexes: set[str], *, max_keys: int, max_docs: int, what: str) -> None:
    """Like ``assert_plan`` for a plan that may read several indexes (an ``$or``'s branches)."""
    assert "COLLSCAN" not in plan.stages, f"{what}: a collection scan: {plan.summary()}"
    assert not IN_MEMORY_SORTS.intersection(plan.stages), f"{what}: an in-memory sort: {plan.summary()}"
    assert plan.indexes and plan.indexes <= indexes, (
        f"{what}: expected only {sorted(indexes)}: {plan.summary()}"
    )
    assert plan.keys <= max_keys, f"{what}: read {plan.keys} keys (at most {max_keys}): {plan.summary()}"
    assert plan.docs <= max_docs, f"{what}: read {plan.docs} documents (at most {max_docs}): {plan.summary()}"


async def test_the_transactional_upsert_reads_the_key_and_the_params_hash_only(backlog: Backlog) -> None:
    """18.1: inside the caller's transaction a task unique by params is an upsert on
    ``{$or: [{key}, {state.unique_live: {$eq: h, $type: "string"}}]}``: each branch on its index
    (``key``, and the ``$type``-partial ``unique_live``, usable only because the query states
    the ``$type``), whatever the backlog. The holder's read (after a refusal) likewise."""
    from mscheduler.drivers.mongo.common import UNIQUE_LIVE_INDEX

    await Publisher(backlog.driver, clock=FakeClock(T0)).send_many(
        [Task(f"uniq-{i:04}", "uniq", {"i": i}, unique_by="params") for i in range(500)]
    )

    async def send_in_a_transaction(driver: MongoDriver) -> None:
        publisher = Publisher(driver, clock=FakeClock(T0))
        async with driver.database.client.start_session() as session:

            async def work(s: Any) -> None:
                await publisher.send(Task("uniq-new", "uniq", {"i": 7}, unique_by="params"), session=s)

            await session.with_transaction(work)

    command = await backlog.command_of("update", send_in_a_transaction)
    (update,) = command["updates"]
    assert update.get("upsert") is True
    plan = await backlog.explain(command)
    assert_indexes_only(
        plan, {KEY_INDEX, UNIQUE_LIVE_INDEX}, max_keys=4, max_docs=2, what="transactional upsert"
    )

    async def holder(driver: MongoDriver) -> None:
        await Publisher(driver, clock=FakeClock(T0)).send(
            Task("uniq-0007", "uniq", {"i": 7}, unique_by="params")
        )
        await driver._unique_holder_of("uniq-0007")

    command = await backlog.command_of("find", holder)
    plan = await backlog.explain(command)
    assert_indexes_only(plan, {UNIQUE_LIVE_INDEX}, max_keys=2, max_docs=1, what="the params hash's holder")


async def test_the_deadline_pass_reads_only_pending_tasks_past_their_deadline(backlog: Backlog) -> None:
    """18.5: the deadline pass (its read for the events, and its update) on the index
    (status, deadline): an equality on ``pending``, then the range on the deadline. 300 finished
    tasks whose deadline passed and 100 pending ones due later are not read."""
    from mscheduler.drivers.mongo.common import DEADLINE_INDEX

    publisher = Publisher(backlog.driver, clock=FakeClock(T0))
    soon, later = T0 + timedelta(seconds=5), NOW + timedelta(hours=1)
    await publisher.send_many(
        [Task(f"dl-done-{i:04}", "dl", option=TaskOption(deadline=soon)) for i in range(300)]
    )
    done = await claim_all(backlog.driver, FINISHER, ["dl"], T0)
    assert all(
        await backlog.driver.finish([FinishParams(k, FINISHER, a, T0, "succeeded") for k, a in done.items()])
    )
    await publisher.send_many(
        [Task(f"dl-late-{i:04}", "dl-waiting", option=TaskOption(deadline=soon)) for i in range(5)]
        + [Task(f"dl-future-{i:04}", "dl-waiting", option=TaskOption(deadline=later)) for i in range(100)]
    )
    command = await backlog.command_of("update", lambda d: d.expire_deadlines(ExpireParams(NOW)))
    (update,) = command["updates"]
    assert update.get("hint") == DEADLINE_INDEX
    plan = await backlog.explain(command)
    assert_plan(plan, DEADLINE_INDEX, max_keys=5 + 2, max_docs=5, what="expire_deadlines")

    async def with_events(driver: MongoDriver) -> None:
        await MongoDriver(driver.database, prefix=SCRATCH_PREFIX, events=True).expire_deadlines(
            ExpireParams(NOW)
        )

    await backlog.scratch.tasks.delete_many({})  # the pass above expired nothing there; again
    command = await backlog.command_of("find", with_events)
    assert command.get("hint") == DEADLINE_INDEX
    plan = await backlog.explain(command)
    assert_plan(plan, DEADLINE_INDEX, max_keys=5 + 2, max_docs=5, what="expire_deadlines (read for events)")


async def test_the_retention_pass_reads_its_batch_and_deletes_by_key_in_bounded_chunks(
    backlog: Backlog,
) -> None:
    """The retention pass (``purge_finished``): the oldest finished keys of one status through the
    finished index, a batch at a time, then deletes by key: a family's children in chunks of at
    most the batch size, then the parents. The backlog's 300 succeeded tasks are read no further
    than the batch."""
    await backlog.scratch.tasks.delete_many({})  # what earlier tests left there
    publisher = Publisher(backlog.scratch, clock=FakeClock(T0))
    children = tuple(Child(name=name) for name in ("alpha", "beta", "gamma"))
    await publisher.send(Task("purge-family", "alpha", children=children, children_mode="parallel"))
    await publisher.send_many([Task(f"done-ok-{i:04}", "alpha") for i in range(3)])
    done = await claim_all(backlog.scratch, FINISHER, ["alpha", "beta", "gamma"], T0)
    # the family finishes first, so the first batch of two holds it and done-ok-0000
    later = T0 + timedelta(seconds=1)
    finished = [
        FinishParams(k, FINISHER, a, later if k.startswith("done-") else T0, "succeeded")
        for k, a in done.items()
    ]
    assert all(await backlog.scratch.finish(finished))
    await backlog.scratch.sync_parents(SyncParentsParams(["purge-family"], T0))

    batch = PurgeParams("succeeded", NOW, limit=2)
    deletes = await backlog.commands_of("delete", lambda d: d.purge_finished(batch))
    (find,) = [c for c in backlog.recorder.commands if next(iter(c)) == "find"]
    assert find.get("hint") == FINISHED_INDEX
    plan = await backlog.explain(find)
    assert_plan(plan, FINISHED_INDEX, max_keys=2 + 1, max_docs=2, what="purge_finished (read)")
    # the family's three children in chunks of at most the batch, then the two parents
    of_children = [c for c in deletes if "state.status" not in c["deletes"][0]["q"]]
    assert [len(c["deletes"][0]["q"]["key"]["$in"]) for c in of_children] == [2, 1]
    assert len(deletes) == 3
    for command in deletes:
        (delete,) = command["deletes"]
        assert delete.get("hint") == KEY_INDEX
        plan = await backlog.explain(command)
        assert_plan(plan, KEY_INDEX, max_keys=2 * 2 + 1, max_docs=2, what="purge_finished (delete)")


async def test_limit_reads_and_writes_touch_one_limit_document(backlog: Backlog) -> None:
    """18.2: an acquire and a slot update are one findAndModify by ``_id`` (one document);
    ``held_slots`` reads the wildcard index ``limits_slots`` (``slots.<attempt>.w``): the limits
    holding those attempts, whatever the number of limits or of slots in them."""
    from mscheduler.domain.limits import Limit
    from mscheduler.drivers.base import AcquireParams, PutLimitParams, SlotsParams
    from mscheduler.drivers.mongo.limits import LIMITS_NAMES_INDEX, LIMITS_SLOTS_INDEX

    driver = backlog.driver
    for i in range(50):
        limit = Limit(key=f"lim-{i:02}", max_running=20_000, rate="20000/s")
        await driver.put_limit(PutLimitParams(limit.key, limit.to_storage(), T0))
    for start in range(0, 10_000, 500):
        tokens = [f"t{n:05}" for n in range(start, start + 500)]
        granted = await driver.acquire_slots(
            AcquireParams("lim-07", f"w{start}", tokens, T0, T0 + timedelta(hours=1))
        )
        assert len(granted.granted) == 500
    scratch = backlog.scratch
    for i in range(50):
        limit = Limit(key=f"lim-{i:02}", max_running=20_000, rate="20000/s")
        await scratch.put_limit(PutLimitParams(limit.key, limit.to_storage(), T0))

    def explain_on_limits(command: dict[str, Any]) -> Awaitable[Plan]:
        explained = {k: v for k, v in command.items() if k not in GENERIC_ARGUMENTS}
        explained[next(iter(explained))] = driver.limits.name

        async def run() -> Plan:
            reply = await backlog.database.command({"explain": explained, "verbosity": "executionStats"})
            return read_plan(reply)

        return run()

    async def recorded(name: str, operation: Callable[[MongoDriver], Awaitable[Any]]) -> dict[str, Any]:
        backlog.recorder.collection = scratch.limits.name
        backlog.recorder.commands.clear()
        try:
            await operation(scratch)
        finally:
            backlog.recorder.collection = None
        (command,) = [c for c in backlog.recorder.commands if next(iter(c)) == name][-1:]
        return command

    acquire = await recorded(
        "findAndModify",
        lambda d: d.acquire_slots(
            AcquireParams("lim-07", "w-new", ["x1", "x2"], NOW, NOW + timedelta(minutes=1))
        ),
    )
    plan = await explain_on_limits(acquire)
    assert "COLLSCAN" not in plan.stages and plan.docs <= 1, plan.summary()
    settle = await recorded(
        "findAndModify",
        lambda d: d.update_slots(
            SlotsParams("lim-07", "w0", NOW, extend={"t00000": NOW + timedelta(hours=2)})
        ),
    )
    plan = await explain_on_limits(settle)
    assert "COLLSCAN" not in plan.stages and plan.docs <= 1, plan.summary()

    held = await recorded("find", lambda d: d.held_slots("w0", ["t00000", "t00001", "none"], NOW))
    assert held.get("hint") == LIMITS_SLOTS_INDEX
    plan = await explain_on_limits(held)
    assert_indexes_only(plan, {LIMITS_SLOTS_INDEX}, max_keys=2 * 4 + 4, max_docs=3, what="held_slots")
    assert await driver.held_slots("w0", ["t00000", "t00001", "none"], NOW) == {
        "t00000": "lim-07",
        "t00001": "lim-07",
    }

    keys = await recorded("find", lambda d: d.limit_keys(["lim-07", "other"]))
    assert keys.get("hint") == LIMITS_NAMES_INDEX
    plan = await explain_on_limits(keys)
    assert_plan(plan, LIMITS_NAMES_INDEX, max_keys=4, max_docs=1, what="limit_keys")


async def test_a_worker_of_three_hundred_names_claims_and_polls_without_an_in_memory_sort(
    backlog: Backlog,
) -> None:
    """18.4: 300 names are 600 claimer tokens; above ``internalQueryMaxScansToExplode`` (200)
    a query on them would sort every due task in memory. Each read the driver sends covers at
    most 200 tokens (ranges merged in order: SORT_MERGE), and the claim itself is by key."""
    from mscheduler.drivers.mongo.common import CLAIM_SORT, MAX_SCANS

    names = [f"many-{i:03}" for i in range(300)]
    await Publisher(backlog.driver, clock=FakeClock(T0)).send_many(
        [Task(f"many-task-{i:04}", names[i % 300], option=TaskOption(priority=i % 3)) for i in range(3000)]
    )
    backlog.recorder.collection = backlog.scratch.tasks.name
    backlog.recorder.commands.clear()
    try:
        await Publisher(backlog.scratch, clock=FakeClock(T0)).send_many(
            [Task(f"many-task-{i:04}", names[i % 300]) for i in range(20)]
        )
        backlog.recorder.commands.clear()
        await backlog.scratch.find_wakeups(WakeupParams(WORKER, names, NOW, 100))
        await backlog.scratch.claim(ClaimParams(WORKER, names, NOW, attempts(5)))
    finally:
        backlog.recorder.collection = None
    finds = [c for c in backlog.recorder.commands if next(iter(c)) == "find"]
    claims = [c for c in backlog.recorder.commands if next(iter(c)) == "findAndModify"]
    assert len(finds) == 6 and len(claims) == 5, [next(iter(c)) for c in backlog.recorder.commands]
    for command in finds:
        assert len(command["filter"]["state.claimers"]["$in"]) <= MAX_SCANS
        plan = await backlog.explain(command)
        index = CLAIM_INDEX if command.get("sort") == dict(CLAIM_SORT) else WAKEUP_INDEX
        assert_plan(plan, index, max_keys=2 * 200 + 200, max_docs=200 + 100, what="a chunk of 300 names")
    for command in claims:
        assert command.get("hint") == KEY_INDEX
        plan = await backlog.explain(command)
        assert_plan(plan, KEY_INDEX, max_keys=2, max_docs=1, what="a claim by key (300 names)")


async def test_the_worker_registry_listings_read_their_page_or_the_live_workers(backlog: Backlog) -> None:
    """18.7: 3,000 stopped registrations (a new worker id per start) and 5 live ones: the live
    listing (metrics, the publisher's check) reads the live ones on ``workers_live``, the
    registry's page reads a page on ``workers_list`` (no in-memory sort, no scan)."""
    from mscheduler.drivers.base import WorkerInfo, WorkerListParams
    from mscheduler.drivers.mongo.workers import WORKERS_LIST_INDEX, WORKERS_LIVE_INDEX

    driver = backlog.driver
    old = NOW - timedelta(hours=2)
    await driver.workers.insert_many(
        [
            {
                "_id": f"gone-{i:05}",
                "host": "h",
                "pid": i,
                "names": ["alpha"],
                "groups": [],
                "concurrency": 1,
                "start_time": old,
                "last_seen": old,
                "stop_time": old,
                "running_cnt": 0,
                "stop_requested": False,
            }
            for i in range(3000)
        ]
    )
    for i in range(5):
        await driver.register_worker(WorkerInfo(f"live-{i}", "h", i, ["alpha"], 4, NOW))

    def workers_command(operation: Callable[[MongoDriver], Awaitable[Any]]) -> Awaitable[dict[str, Any]]:
        async def run() -> dict[str, Any]:
            backlog.recorder.collection = backlog.scratch.workers.name
            backlog.recorder.commands.clear()
            try:
                await operation(backlog.scratch)
            finally:
                backlog.recorder.collection = None
            return [c for c in backlog.recorder.commands if next(iter(c)) == "find"][-1]

        return run()

    async def explain(command: dict[str, Any]) -> Plan:
        explained = {k: v for k, v in command.items() if k not in GENERIC_ARGUMENTS}
        explained["find"] = driver.workers.name
        return read_plan(
            await backlog.database.command({"explain": explained, "verbosity": "executionStats"})
        )

    live = await workers_command(lambda d: d.list_workers(WorkerListParams(NOW, live_since=NOW - LEASE)))
    assert live.get("hint") == WORKERS_LIVE_INDEX
    assert_plan(await explain(live), WORKERS_LIVE_INDEX, max_keys=5 + 2, max_docs=5, what="live workers")
    assert live.get("projection") == {"schemas": 0}  # the published params schemas: only when asked
    handlers = await workers_command(
        lambda d: d.list_workers(WorkerListParams(NOW, live_since=NOW - LEASE, schemas=True))
    )
    assert handlers.get("hint") == WORKERS_LIVE_INDEX and "projection" not in handlers
    assert_plan(await explain(handlers), WORKERS_LIVE_INDEX, max_keys=5 + 2, max_docs=5, what="live handlers")
    page = await workers_command(lambda d: d.list_workers(WorkerListParams(NOW, limit=50)))
    assert page.get("hint") == WORKERS_LIST_INDEX
    plan = await explain(page)
    # the retention (last seen within a day) is checked on the page's documents: the TTL index
    # removes the older ones, so they are few
    assert_plan(plan, WORKERS_LIST_INDEX, max_keys=50 + 2, max_docs=50 + 1, what="a page of workers")


# -- the event log (issue 17 A3) -------------------------------------------------------------------


async def test_event_listings_read_one_range_in_index_order() -> None:
    """A task's history (``events_task``: key, time, step, seq, _id) and a time range
    (``events_order``: time, step, seq, _id) are read in the listing's order, the writers'
    sequence included: no in-memory sort, about ``limit`` keys whatever the log holds."""
    from mscheduler.domain.events import EventKind, EventWriter, task_event
    from mscheduler.drivers.base import EventQuery, InsertEventsParams
    from mscheduler.drivers.mongo.events import EVENTS_KEY_INDEX, EVENTS_TIME_INDEX

    recorder = CommandRecorder()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(REAL_URI, event_listeners=[recorder])
    database = client[f"mscheduler_events_{uuid.uuid4().hex[:8]}"]
    try:
        driver = MongoDriver(database, events=True)
        await driver.setup()
        writer = EventWriter("explain")
        docs = [
            task_event(writer, kind, f"k{i:03}", "job", T0 + timedelta(milliseconds=j))
            for i in range(300)
            for j in range(5)
            for kind in (EventKind.PAUSED, EventKind.RESUMED)  # two events of each millisecond
        ]
        assert await driver.insert_events(InsertEventsParams(docs, NOW)) == len(docs)
        cases = [
            (EventQuery(keys=["k007"], limit=100), EVENTS_KEY_INDEX, 10),
            (EventQuery(time_from=T0 + timedelta(milliseconds=2), limit=50), EVENTS_TIME_INDEX, 50),
        ]
        for query, index, returned in cases:
            recorder.collection = driver.events.name
            recorder.commands.clear()
            try:
                listed = await driver.list_events(query)
            finally:
                recorder.collection = None
            assert len(listed) == returned
            command = [c for c in recorder.commands if next(iter(c)) == "find"][-1]
            assert command.get("hint") == index
            assert list(command["sort"]) == ["time", "step", "seq", "_id"]
            explained = {k: v for k, v in command.items() if k not in GENERIC_ARGUMENTS}
            reply = await database.command({"explain": explained, "verbosity": "executionStats"})
            plan = read_plan(reply)
            assert_plan(plan, index, max_keys=returned + 2, max_docs=returned, what=f"list_events {query}")
    finally:
        await client.drop_database(database.name)
        await client.close()


async def test_reads_by_key_and_the_plain_transactional_upsert_read_one_task(backlog: Backlog) -> None:
    """Issue 24: a task read by key names its partition (a sharded store's one shard), on the
    key index; a claim's recovery read (its attempt token and partition) reads the attempts
    index; a finish's read-back reads the finished keys; the transactional upsert of a task not
    unique by params names the whole shard key {_id, part}: one document each."""
    key, attempt = sorted(backlog.running.items())[0]
    command = await backlog.command_of("find", lambda d: d.get_task(key))
    assert command["filter"] == {"key": key, "part": 0}
    assert_one_task(await backlog.explain(command), {KEY_INDEX}, "get task")

    async def recover(driver: MongoDriver) -> None:
        await driver._recover_claim(ClaimParams(WORKER, list(NAMES), NOW, [attempt]), attempt, 0)

    command = await backlog.command_of("find", recover)
    assert command["filter"] == {"state.worker_states.attempt": attempt, "part": 0}
    assert_one_task(await backlog.explain(command), {ATTEMPT_INDEX}, "claim recovery")

    async def read_back(driver: MongoDriver) -> None:
        await driver._finish_outcomes([FinishParams(key, WORKER, "not-this-attempt", NOW, "succeeded")])

    command = await backlog.command_of("find", read_back)
    assert_one_task(await backlog.explain(command), {KEY_INDEX}, "finish read-back")

    async def send_in_a_transaction(driver: MongoDriver) -> None:
        publisher = Publisher(driver, clock=FakeClock(T0))
        async with driver.database.client.start_session() as session:

            async def work(s: Any) -> None:
                await publisher.send(Task("plain-new", "alpha"), session=s)

            await session.with_transaction(work)

    command = await backlog.command_of("update", send_in_a_transaction)
    (update,) = command["updates"]
    assert update["q"] == {"_id": "plain-new", "part": 0} and update.get("upsert") is True
    assert_indexes_only(
        await backlog.explain(command), {ID_INDEX}, max_keys=1, max_docs=1, what="plain upsert"
    )


# -- fairness lanes and priority aging -----------------------------------------------------------

LANE_NAME = "delta"  # tasks with fairness keys: one key with a backlog, ten small ones
AGING_NAME = "epsilon"  # tasks that age


async def test_a_claim_of_one_lane_and_the_lane_list_read_bounded_ranges(backlog: Backlog) -> None:
    """A claim of one fairness key is an equality on that key's claimer tokens: the 5,000 tasks
    of another key are outside its ranges. The keys with claimable tasks are one DISTINCT_SCAN
    of the partial ``lanes`` index (a seek per key, not a key per task); the wake-ups of several
    lanes are merged ranges of the wake-up index."""
    publisher = Publisher(backlog.driver, clock=FakeClock(T0))
    await publisher.send_many(
        [Task(f"lane-big-{i:05}", LANE_NAME, option=TaskOption(fair_key="big")) for i in range(5000)]
        + [
            Task(f"lane-small-{i:03}", LANE_NAME, option=TaskOption(fair_key=f"k{i % 10}"))
            for i in range(100)
        ]
    )
    lanes: list[str | None] = ["k3"]
    params = ClaimParams(WORKER, [LANE_NAME], NOW, attempts(1), host="h", pid=1, lanes=lanes)
    command = await backlog.command_of("findAndModify", lambda d: d.claim(params))
    assert command.get("hint") == CLAIM_INDEX
    tokens = claimer_tokens([LANE_NAME], WORKER, lanes=lanes)
    plan = await backlog.explain(command)
    assert_plan(plan, CLAIM_INDEX, max_keys=4 * len(tokens) + 4, max_docs=3, what="claim of one lane")

    command = await backlog.command_of("distinct", lambda d: d.find_lanes(LaneParams([LANE_NAME])))
    plan = await backlog.explain(command)
    assert "DISTINCT_SCAN" in plan.stages, plan.summary()
    assert_plan(plan, LANES_INDEX, max_keys=2 * 11 + 2, max_docs=0, what="find_lanes")

    # the waits per key: covered (index keys only), a key per due task with a key of the names;
    # the sort is of the groups (one per key), after them
    waits = KeyWaitParams(NOW, names=[LANE_NAME])
    command = await backlog.command_of("aggregate", lambda d: d.key_waits(waits))
    assert command.get("hint") == LANES_INDEX
    plan = await backlog.explain(command)
    assert "COLLSCAN" not in plan.stages and "FETCH" not in plan.stages, plan.summary()
    assert plan.indexes == {LANES_INDEX}, plan.summary()
    assert plan.keys <= 5100 + 12 and plan.docs == 0, plan.summary()

    many: list[str | None] = [None, "big", *(f"k{i}" for i in range(10))]
    limit = 20
    wakeups = WakeupParams(WORKER, [LANE_NAME], NOW, limit, lanes=many)
    command = await backlog.command_of("find", lambda d: d.find_wakeups(wakeups))
    assert command.get("hint") == WAKEUP_INDEX
    tokens = claimer_tokens([LANE_NAME], WORKER, lanes=many)
    plan = await backlog.explain(command)
    assert_plan(
        plan,
        WAKEUP_INDEX,
        max_keys=limit + 2 * len(tokens) + 2,
        max_docs=limit + len(tokens),
        what="lane wake-ups",
    )


async def test_the_claim_of_tasks_that_age_reads_a_range_bounded_by_the_aging_span(backlog: Backlog) -> None:
    """A task that ages is in the claim order by ``claim_at - priority x aging``: the claim's
    range ends at now on that time, so tasks due tomorrow are outside it; tasks not yet due but
    whose order time has passed (due within ``priority x aging``) are read as index keys and
    skipped there (their due time is in the key), never fetched."""
    publisher = Publisher(backlog.driver, clock=FakeClock(T0))
    aging = timedelta(seconds=1)
    tomorrow = T0 + timedelta(days=1)
    soon = NOW + timedelta(seconds=5)  # order time NOW - 5 s at priority 10: in the range, not due
    await publisher.send_many(
        [
            Task(
                f"age-tomorrow-{i:05}",
                AGING_NAME,
                option=TaskOption(priority=10, aging=aging, run_at=tomorrow),
            )
            for i in range(5000)
        ]
        + [
            Task(f"age-soon-{i:03}", AGING_NAME, option=TaskOption(priority=10, aging=aging, run_at=soon))
            for i in range(50)
        ]
        + [
            Task(f"age-due-{i:03}", AGING_NAME, option=TaskOption(priority=i % 3, aging=aging))
            for i in range(300)
        ]
    )
    params = ClaimParams(WORKER, [AGING_NAME], NOW, attempts(1), host="h", pid=1)
    command = await backlog.command_of("findAndModify", lambda d: d.claim(params))
    assert command.get("hint") == CLAIM_INDEX
    assert list(command["sort"].items()) == [
        ("state.claim_priority", -1),
        ("state.targeted", -1),
        ("state.order_at", 1),
    ]
    tokens = claimer_tokens([AGING_NAME], WORKER)
    plan = await backlog.explain(command)
    assert_plan(plan, CLAIM_INDEX, max_keys=50 + 4 * len(tokens) + 4, max_docs=3, what="claim of aging tasks")
