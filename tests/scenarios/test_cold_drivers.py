"""Every entry point on every store layout, through a driver that was never prepared.

A driver learns the store's layout (its partitions) from the store; one that acted before reading
it took a 4-partition store for an unpartitioned one: a cancel through the CLI's
``Operations(MongoDriver(db))`` was refused for 8 tasks of 8 ("kept changing"), the lease pass of
``mscheduler maintenance`` expired none of 8 expired leases, and a task it published was stored in
partition 0. Every test here sets a store up (P = 1 and P = 4; the memory driver and mongomock)
through the administrator's driver, then calls one entry point through a driver built as that
entry point's surface builds it and prepared by nobody (``cold_world.py``), acts on 8 tasks spread
over every partition, and checks with the administrator's driver that the action was applied to
each of them and that every stored task sits in its own partition.

The tables below are checked against the code: every public method of ``Operations``, every
operator command of the CLI, every service. A new one without a case here fails
``test_every_*_has_a_case``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from mscheduler import (
    ExecutorClient,
    ExpiryService,
    Operations,
    OptionChange,
    Plan,
    Planner,
    PlanTiming,
    Publisher,
    Retention,
    RetentionService,
    Task,
)
from mscheduler.domain.schedule import EverySchedule
from mscheduler.drivers.base import ClaimParams, FinishParams
from mscheduler.services.children import ChildSync
from mscheduler.services.events import MAX_REPLAY_LIMIT, Events
from mscheduler.web import ApiTokens, create_app
from mscheduler.web.guards import ApiLimits
from tests.scenarios.cold_world import KEYS, LAYOUT_IDS, LAYOUTS, NAME, STEPS, World, keys, make_world

Case = Callable[[World, Operations], Awaitable[None]]
OPERATIONS: dict[str, Case] = {}


def covers(*methods: str) -> Callable[[Case], Case]:
    def register(case: Case) -> Case:
        for method in methods:
            OPERATIONS.setdefault(method, case)
        OPERATIONS[case.__name__] = case
        return case

    return register


@pytest.fixture(params=LAYOUTS, ids=LAYOUT_IDS)
async def world(request: pytest.FixtureRequest) -> World:
    kind, partitions = request.param
    return await make_world(kind, partitions)


# -- Operations: every public method -------------------------------------------------------------


@covers("send", "get_task", "get_tasks")
async def sends_each_task_to_its_partition(world: World, ops: Operations) -> None:
    assert [await ops.send(Task(k, NAME)) for k in KEYS] == [True] * 8
    assert [await ops.send(Task(k, NAME)) for k in KEYS] == [False] * 8, "idempotent by key"
    assert [(await ops.get_task(k)).key for k in KEYS] == KEYS
    assert sorted(await ops.get_tasks(KEYS)) == sorted(KEYS)


@covers("send_many")
async def sends_a_batch_to_each_partition(world: World, ops: Operations) -> None:
    assert await ops.send_many([Task(k, NAME) for k in KEYS]) == [True] * 8
    assert await ops.send_many([Task(k, NAME) for k in KEYS]) == [False] * 8


@covers("list_tasks", "page_tasks", "count_tasks", "count_by_status", "stats")
async def reads_every_partition(world: World, ops: Operations) -> None:
    await world.pending()
    assert sorted(t.key for t in await ops.list_tasks()) == sorted(KEYS)
    assert len((await ops.page_tasks(limit=100)).tasks) == 8
    assert (await ops.count_tasks()).count == 8
    assert (await ops.count_by_status()).get("pending") == 8
    assert (await ops.stats(window=timedelta(hours=1))).counts.get("pending") == 8


@covers("key_waits")
async def reads_the_fairness_keys_of_every_partition(world: World, ops: Operations) -> None:
    await world.pending(fair_key="acme")
    [acme] = await ops.key_waits()
    assert (acme.key, acme.due) == ("acme", 8)


@covers("cancel")
async def cancels_each_task(world: World, ops: Operations) -> None:
    await world.pending()
    for key in KEYS:
        assert (await ops.cancel(key, "not needed")).status.value == "cancelled"
    assert set((await world.statuses(KEYS)).values()) == {"cancelled"}


@covers("pause", "resume")
async def pauses_and_resumes_each_task(world: World, ops: Operations) -> None:
    await world.pending()
    for key in KEYS:
        assert (await ops.pause(key)).paused
    assert all(doc["state"]["paused"] for doc in (await world.docs()).values())
    for key in KEYS:
        assert not (await ops.resume(key)).paused


@covers("remove")
async def removes_each_task(world: World, ops: Operations) -> None:
    await world.pending()
    for key in KEYS:
        await ops.remove(key)
    assert await world.docs() == {}


@covers("restart", "restart_many")
async def restarts_each_failed_task(world: World, ops: Operations) -> None:
    failed = await world.failed()
    for key in failed[:4]:
        assert (await ops.restart(key)).status.value == "pending"
    outcomes = await ops.restart_many(failed[4:])
    assert all(o.restarted for o in outcomes.values()), outcomes
    assert set((await world.statuses(failed)).values()) == {"pending"}


@covers("workflow", "restart_step")
async def shows_each_workflow_and_restarts_its_step(world: World, ops: Operations) -> None:
    parents = await world.finished_steps()
    for parent in parents:
        steps = (await ops.workflow(parent)).steps
        assert [(s.name, s.status.value) for s in steps] == [(n, "succeeded") for n in STEPS]
    for parent in parents:
        restarted = await ops.restart_step(parent, STEPS[0])
        assert [s.status.value for s in restarted.steps] == ["pending", "succeeded"], parent


@covers("list_handlers")
async def lists_the_live_workers_handlers(world: World, ops: Operations) -> None:
    assert [h.name for h in await ops.list_handlers()] == sorted([NAME, *STEPS])


@covers("control_many", "control_matching")
async def controls_many_tasks(world: World, ops: Operations) -> None:
    await world.pending()
    outcomes = await ops.control_many("pause", KEYS)
    assert {o.outcome for o in outcomes} == {"done"}, outcomes
    pages = await ops.control_matching("cancel", name=NAME)
    done = [o async for page in pages for o in page]
    assert len(done) == 8 and {o.outcome for o in done} == {"done"}, done
    assert set((await world.statuses(KEYS)).values()) == {"cancelled"}


@covers("edit")
async def edits_each_task(world: World, ops: Operations) -> None:
    await world.pending()
    for key in KEYS:
        assert (await ops.edit(key, OptionChange(priority=7))).priority == 7
    assert {doc["option"]["priority"] for doc in (await world.docs()).values()} == {7}


@covers("set_status")
async def sets_the_status_of_each_task(world: World, ops: Operations) -> None:
    await world.pending()
    for key in KEYS:
        assert (await ops.set_status(key, "succeeded", reason="by hand")).status.value == "succeeded"
    assert set((await world.statuses(KEYS)).values()) == {"succeeded"}


@covers("set_child_status", "restart_child")
async def steers_the_children_of_each_parent(world: World, ops: Operations) -> None:
    parents = await world.family()
    for parent in parents:
        await ops.set_child_status(parent, "step.one", "failed", reason="by hand")
    assert set((await world.statuses(parents)).values()) == {"failed"}, "the parents were synced"
    for parent in parents:
        assert (await ops.restart_child(parent, "step.one")).status.value == "pending"
    assert set((await world.statuses(parents)).values()) == {"pending"}


@covers("add_plan", "get_plan", "list_plans", "run_plan_now")
async def runs_plans_now(world: World, ops: Operations) -> None:
    for i in range(8):
        timing = PlanTiming(schedule=EverySchedule(interval=timedelta(days=1), start=world.now))
        await ops.add_plan(Plan(plan_id=f"p-{i}", name=NAME, timing=timing))
    assert len(await ops.list_plans()) == 8 and (await ops.get_plan("p-3")).plan_id == "p-3"
    runs = [(await ops.run_plan_now(f"p-{i}")).key for i in range(8)]
    assert set((await world.statuses(runs)).values()) == {"pending"}


@covers("suspend_plan", "resume_plan", "skip_plan", "edit_plan", "remove_plan")
async def steers_plans(world: World, ops: Operations) -> None:
    ids = await world.plans()
    for plan_id in ids:
        await ops.suspend_plan(plan_id)
        await ops.resume_plan(plan_id)
        await ops.skip_plan(plan_id, 2)
        assert (await ops.edit_plan(plan_id, params={"n": 1})).params == {"n": 1}
        await ops.remove_plan(plan_id)
    assert await ops.list_plans() == []


@covers("list_workers", "request_worker_stop")
async def reads_and_stops_workers(world: World, ops: Operations) -> None:
    await world.worker()
    assert [w.worker_id for w in await ops.list_workers()] == ["w-live", "w-handler"]
    assert await ops.request_worker_stop("w-live")


@covers("set_limit", "get_limit", "list_limits", "remove_limit")
async def keeps_limits(world: World, ops: Operations) -> None:
    await ops.set_limit(NAME, max_running=2)
    assert (await ops.get_limit(NAME)).limit.max_running == 2
    assert [info.limit.key for info in await ops.list_limits()] == [NAME]
    await ops.remove_limit(NAME)
    assert await ops.list_limits() == []


@pytest.mark.parametrize("case", sorted({c.__name__ for c in OPERATIONS.values()}))
async def test_operations_on_a_driver_nobody_prepared(world: World, case: str) -> None:
    await OPERATIONS[case](world, world.ops())
    assert await world.misplaced() == []


def test_every_operations_method_has_a_case() -> None:
    public = {
        name
        for name, member in inspect.getmembers(Operations, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }
    public |= {"control_matching"}  # an async generator's factory
    assert public - set(OPERATIONS) == set()


# -- services, the publisher, remote executors -----------------------------------------------------


async def test_the_expiry_service_marks_every_partition(world: World) -> None:
    running = await world.running()
    await world.pending("d", deadline=world.now + timedelta(seconds=10))
    world.clock.advance(timedelta(minutes=1))
    expiry = ExpiryService(world.cold(), clock=world.clock)
    await expiry.run_once()
    assert (expiry.leases_lost, expiry.deadlines_expired) == (8, 8)
    assert {
        d["state"]["worker_states"][-1]["status"] for k, d in (await world.docs()).items() if k in running
    } == {"lost"}
    assert set((await world.statuses(keys("d"))).values()) == {"expired"}


async def test_the_planner_places_each_run_in_its_partition(world: World) -> None:
    await world.plans()
    planner = Planner(world.cold(), clock=world.clock)
    assert await planner.run_once() == 8
    assert len(await world.docs()) == 8
    assert await world.misplaced() == []


async def test_retention_removes_from_every_partition(world: World) -> None:
    await world.succeeded()
    world.clock.advance(timedelta(days=2))
    retention = RetentionService(world.cold(), Retention(succeeded=timedelta(days=1)), clock=world.clock)
    assert await retention.run_once() == 8
    assert await world.docs() == {}


async def test_the_children_reconciler_syncs_every_partition(world: World) -> None:
    parents = await world.family()
    # each parent's first child done through the store, the parent not synced
    attempts = [f"a-{i}" for i in range(8)]
    claimed = await world.admin.claim(ClaimParams("w-old", ["step.one"], world.now, attempts))
    assert sorted(c.key for c in claimed) == sorted(f"{p}/step.one" for p in parents)
    done = [FinishParams(c.key, "w-old", c.attempt, world.now, "succeeded") for c in claimed]
    assert await world.admin.finish(done) == [True] * 8
    assert await ChildSync(world.cold(), clock=world.clock).run_once() == 8
    docs = await world.docs()
    assert all(docs[p]["state"]["children"][0]["status"] == "succeeded" for p in parents)


async def test_the_publisher_sends_and_edits_in_every_partition(world: World) -> None:
    publisher = Publisher(world.cold(), clock=world.clock)
    assert await publisher.send_many([Task(k, NAME) for k in KEYS[:4]]) == [True] * 4
    for key in KEYS[4:]:
        assert await publisher.send(Task(key, NAME))
    for key in KEYS:
        assert (await publisher.update_option(key, OptionChange(priority=3))).priority == 3
        assert (await publisher.get(key)).option.priority == 3
    assert await world.misplaced() == []


async def test_the_publisher_edits_before_its_first_send(world: World) -> None:
    await world.pending()
    publisher = Publisher(world.cold(), clock=world.clock)
    for key in KEYS:
        assert (await publisher.update_option(key, OptionChange(priority=4))).priority == 4
    assert {doc["option"]["priority"] for doc in (await world.docs()).values()} == {4}


EXECUTOR_TOKEN = "executor-token-0123456789abcdef"


async def test_remote_executors_lease_ping_and_report_in_every_partition(world: World) -> None:
    await world.pending()
    tokens = ApiTokens(executor=[EXECUTOR_TOKEN])
    app = create_app(operations=world.ops(), tokens=tokens)
    transport = httpx.ASGITransport(app=app)
    client = ExecutorClient(
        "http://test", EXECUTOR_TOKEN, "ex-1", [NAME], transport=transport, clock=world.clock
    )
    async with client:
        leased: dict[str, Any] = {}
        for _ in range(8):
            for task in await client.lease(max_tasks=8):
                leased[task.key] = task
            if len(leased) == 8:
                break
        assert sorted(leased) == sorted(KEYS)
        answers = await client.ping([{"key": t.key, "attempt": t.attempt} for t in leased.values()])
        assert sorted(a["key"] for a in answers if a["state"] == "alive") == sorted(KEYS), answers
        for task in leased.values():
            await client.report(task.key, task.attempt, "succeeded", result={"ok": True})
    assert set((await world.statuses(KEYS)).values()) == {"succeeded"}


# -- the CLI, on the store and over the API -----------------------------------------------------------

CliCase = tuple[
    Callable[[World], Coroutine[Any, Any, Any]], list[list[str]], Callable[[World], Coroutine[Any, Any, bool]]
]
REPLAY_FROM = (datetime.now(UTC) - timedelta(days=3)).isoformat()

CLI_KEYS = keys("t", 4)  # one task in each partition of 4: a command per key is one process each


def _all(status: str, prefix: str = "t") -> Callable[[World], Coroutine[Any, Any, bool]]:
    async def check(world: World) -> bool:
        return set((await world.statuses(keys(prefix, 4))).values()) == {status}

    return check


async def _nothing(world: World) -> None:
    return None


async def _pending(world: World) -> None:
    await world.pending(n=4)


async def _failed(world: World) -> None:
    await world.failed(n=4)


async def _priority_is_5(world: World) -> bool:
    return {doc["option"]["priority"] for doc in (await world.docs()).values()} == {5}


async def _paused(world: World) -> bool:
    return all(doc["state"]["paused"] for doc in (await world.docs()).values())


async def _sent(world: World) -> bool:
    return sorted(await world.docs()) == sorted(CLI_KEYS)


async def _none_left(world: World) -> bool:
    return await world.docs() == {}


async def _plan_gone(world: World) -> bool:
    return await world.ops(world.admin).list_plans() == []


async def _limit_set(world: World) -> bool:
    return [info.limit.key for info in await world.ops(world.admin).list_limits()] == ["mail"]


async def _worker_stopped(world: World) -> bool:
    workers = await world.ops(world.admin).list_workers()
    return any(w.stop_requested for w in workers if w.worker_id == "w-live")


async def _first_steps_pending(world: World) -> bool:
    return set((await world.statuses([f"{k}/{STEPS[0]}" for k in keys("wf", 4)])).values()) == {"pending"}


async def _true(world: World) -> bool:
    return True


def _each(*args: str) -> list[list[str]]:
    return [[a.replace("{k}", k) for a in args] for k in CLI_KEYS]


CLI: dict[str, CliCase] = {
    "tasks ls": (_pending, [["tasks", "ls", "--json"]], _true),
    "tasks show": (_pending, _each("tasks", "show", "{k}", "--json"), _true),
    "tasks send": (_nothing, _each("tasks", "send", NAME, "--key", "{k}"), _sent),
    "tasks cancel": (_pending, _each("tasks", "cancel", "{k}"), _all("cancelled")),
    "tasks pause": (_pending, _each("tasks", "pause", "{k}"), _paused),
    "tasks resume": (_pending, _each("tasks", "resume", "{k}"), _all("pending")),
    "tasks restart": (_failed, [["tasks", "restart", *keys("f", 4), "--json"]], _all("pending", "f")),
    "tasks remove": (_pending, _each("tasks", "remove", "{k}"), _none_left),
    "tasks set-status": (_pending, _each("tasks", "set-status", "{k}", "failed"), _all("failed")),
    "tasks edit": (_pending, _each("tasks", "edit", "{k}", "--priority", "5"), _priority_is_5),
    "tasks graph": (World.finished_steps, [["tasks", "graph", keys("wf", 1)[0], "--json"]], _true),
    "tasks restart-step": (
        World.finished_steps,
        [["tasks", "restart-step", k, STEPS[0]] for k in keys("wf", 4)],
        _first_steps_pending,
    ),
    "plans ls": (World.plans, [["plans", "ls", "--json"]], _true),
    "plans show": (World.plans, [["plans", "show", "plan-1"]], _true),
    "plans suspend": (World.plans, [["plans", "suspend", "plan-1"]], _true),
    "plans resume": (World.plans, [["plans", "resume", "plan-1"]], _true),
    "plans skip": (World.plans, [["plans", "skip", "plan-1", "2"]], _true),
    "plans remove": (lambda w: w.plans(1), [["plans", "remove", "plan-0"]], _plan_gone),
    "plans add": (_nothing, [["plans", "add", "p2", NAME, "--cron", "0 3 * * *"]], _true),
    "limits ls": (_nothing, [["limits", "ls"]], _true),
    "limits show": (
        _nothing,
        [["limits", "set", NAME, "--max-running", "3"], ["limits", "show", NAME]],
        _true,
    ),
    "limits set": (_nothing, [["limits", "set", "mail", "--names", NAME, "--max-running", "3"]], _limit_set),
    "limits rm": (_nothing, [["limits", "set", NAME, "--max-running", "3"], ["limits", "rm", NAME]], _true),
    "workers ls": (World.worker, [["workers", "ls", "--json"]], _true),
    "workers handlers": (_nothing, [["workers", "handlers"]], _true),
    "workers stop": (World.worker, [["workers", "stop", "w-live"]], _worker_stopped),
    "stats": (_pending, [["stats", "--json"]], _true),
    "events ls": (_pending, [["events", "ls"]], _true),
    # the seeded events are two hours old on the command's clock (and on the API server's): both
    # are given a replay limit of a week (``REPLAY_FROM``: three days back)
    "events tail": (_pending, [["events", "tail", "--since", REPLAY_FROM, "--count", "4"]], _true),
}
# the store's own commands: not over the API
STORE_ONLY = {"maintenance", "check"}


def test_every_operator_command_has_a_case() -> None:
    from typer.main import get_command

    from mscheduler.cli.main import full_app

    root = get_command(full_app())
    names: set[str] = set()
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        sub = getattr(command, "commands", None)
        names |= {f"{name} {s}" for s in sub} if sub else {name}
    operator = {
        n for n in names if n.split()[0] in {"tasks", "plans", "limits", "workers", "stats", "events"}
    }
    assert operator - set(CLI) == set()
    assert STORE_ONLY <= names


class _Client:
    """What ``mongo_client`` gives the CLI: the world's database under every name."""

    def __init__(self, database: Any) -> None:
        self.database = database

    def __getitem__(self, name: str) -> Any:
        return self.database

    def get_default_database(self, fallback: str) -> Any:
        return self.database

    async def close(self) -> None:
        return None


@pytest.fixture
def on_store(monkeypatch: pytest.MonkeyPatch) -> Callable[[World], None]:
    """Point the CLI at the world's store as it connects to a server: it builds its own
    ``Operations(MongoDriver(db))`` per command (the memory driver: the store's own object)."""
    from mscheduler.cli import check as cli_check
    from mscheduler.cli import common as cli_ops

    monkeypatch.setattr(cli_ops, "Events", functools.partial(Events, max_replay=MAX_REPLAY_LIMIT))

    def point(world: World) -> None:
        if world.database is None:
            monkeypatch.setattr(cli_ops, "operations_override", lambda: Operations(world.admin))
            return
        client = _Client(world.database)
        monkeypatch.setattr(cli_ops, "operations_override", None)
        for module in (cli_ops, cli_check):
            monkeypatch.setattr(module, "mongo_client", lambda uri, timeout: client)
            monkeypatch.setattr(module, "ensure_reachable", _reachable)

    return point


async def _reachable(*args: Any, **kwargs: Any) -> float:
    return 1.0


@pytest.fixture(scope="module")
def api() -> Iterator[Any]:
    from tests.acceptance.api_server import ApiServer

    server = ApiServer(Operations(_placeholder()), limits=ApiLimits(replay_seconds=MAX_REPLAY_LIMIT))
    server.start()
    yield server
    server.stop()


def _placeholder() -> Any:
    from mscheduler import MemoryDriver

    return MemoryDriver()


@functools.cache
def _command() -> Any:
    """The CLI as a click command, built once (typer's test runner builds it at every call)."""
    from typer.main import get_command

    from mscheduler.cli.main import full_app

    return get_command(full_app())


def cli(*args: str) -> tuple[int, str, str]:
    """``mscheduler ARGS`` in this process (``tests.acceptance.support.cli``, the command built
    once): (exit code, stdout, stderr)."""
    import click.testing

    runner = click.testing.CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    result = runner.invoke(_command(), list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _run_cli(world: World, commands: list[list[str]], extra: list[str]) -> None:
    for args in commands:
        code, out, err = cli(*args, *(extra or ["--mongodb-uri", "mongodb://store/"]))
        assert code == 0, (args, out, err)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("command", sorted(CLI))
def test_each_command_on_the_store(
    command: str, layout: tuple[str, int], on_store: Callable[[World], None]
) -> None:
    world = asyncio.run(make_world(*layout))
    seed, commands, check = CLI[command]
    asyncio.run(seed(world))
    on_store(world)
    _run_cli(world, commands, [])
    assert asyncio.run(check(world)), command
    assert asyncio.run(world.misplaced()) == []


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("command", sorted(CLI))
def test_each_command_over_the_api(api: Any, command: str, layout: tuple[str, int]) -> None:
    from tests.acceptance.api_server import ADMIN_TOKEN

    world = asyncio.run(make_world(*layout))
    seed, commands, check = CLI[command]
    asyncio.run(seed(world))
    api.serve(Operations(world.cold(events=True)))  # as `mscheduler web --events` builds it
    _run_cli(world, commands, ["--api-url", api.url, "--token", ADMIN_TOKEN])
    assert asyncio.run(check(world)), command
    assert asyncio.run(world.misplaced()) == []


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_maintenance_on_the_store(layout: tuple[str, int], on_store: Callable[[World], None]) -> None:
    world = asyncio.run(make_world(*layout))

    async def seed() -> None:
        await world.succeeded()
        await world.running()
        await world.pending("d", deadline=world.now + timedelta(seconds=10))
        world.clock.advance(timedelta(hours=1, minutes=59))  # the real time (the CLI's)
        await world.plans()  # each due now

    asyncio.run(seed())
    on_store(world)
    code, out, err = cli(
        "maintenance", "--once", "--json", "--keep-succeeded", "1h", "--mongodb-uri", "mongodb://x/"
    )
    assert code == 0, (out, err)
    assert json.loads(out) == {"leases_lost": 8, "deadlines_expired": 8, "occurrences": 8, "removed": 8}
    assert set((await_(world.statuses(keys("d")))).values()) == {"expired"}
    assert asyncio.run(world.misplaced()) == []


def await_(coro: Awaitable[Any]) -> Any:
    async def run() -> Any:
        return await coro

    return asyncio.run(run())


@pytest.mark.parametrize("partitions", [1, 4])
def test_check_reports_the_stored_layout(partitions: int, on_store: Callable[[World], None]) -> None:
    world = asyncio.run(make_world("mongomock", partitions))
    on_store(world)
    _code, out, _err = cli("check", "--mongodb-uri", "mongodb://x/")
    assert re.search(rf"^layout\W+OK\W+{partitions} partition", out, re.MULTILINE), out
