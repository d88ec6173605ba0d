"""Every operator command both ways — on the store (``Operations``) and over the REST API
(``--api-url`` / ``--token``, ``RemoteOperations``) — on two identical stores: the same output,
the same exit code, the same refusal, the same store afterwards. And what only the API way can
meet: an address where nothing answers (exit 3), a refused token (exit 4), something that is not
an mscheduler API (exit 5), a missing token or a second store (exit 2). Loopback only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from mscheduler import Child, FakeClock, MemoryDriver, Operations, Task, TaskOption
from mscheduler.cli import common as cli_ops
from mscheduler.domain.events import EventWriter
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import ClaimParams, FinishParams, WorkerInfo
from tests.acceptance.api_server import (
    ADMIN_TOKEN,
    PUBLISH_TOKEN,
    READ_TOKEN,
    ApiServer,
    NotTheApi,
)
from tests.acceptance.support import cli

SINCE = "2030-01-01T00:00:00Z"  # the fake clock's start


async def _seed(driver: MemoryDriver) -> None:
    clock = driver.clock
    assert isinstance(clock, FakeClock)
    ops = Operations(driver, clock=clock)
    names = ("job.a", "job.run", "job.boom", "job.done", "step.one", "step.two", "job.x", "job.typed")
    schemas = [("job.typed", '{"properties":{"n":{"type":"integer"}},"required":["n"],"type":"object"}')]
    await driver.register_worker(WorkerInfo("w-live", "host-1", 42, names, 4, clock.now(), ("gpu",), schemas))
    for key in ("a-1", "a-2", "a-3"):
        await ops.send(Task(key, "job.a", {"n": key}, option=TaskOption(priority=1)))
        clock.advance(0.001)
    await ops.send(Task("k-1", "job.x", {}, option=TaskOption(fair_key="acme")))
    await ops.send(Task("fam", "job.family", {}, children=["step.one", "step.two"]))
    steps = [Child("step.one"), Child("step.two", needs=["step.one"])]
    await ops.send(Task("flow", "job.flow", {}, children=steps))
    for key, name in (("run-1", "job.run"), ("boom-1", "job.boom"), ("done-1", "job.done")):
        await ops.send(Task(key, name, {}))
        clock.advance(0.001)
        now = clock.now()
        [claimed] = await driver.claim(ClaimParams("w1", [name], now, [f"{key}-attempt"]))
        if key == "boom-1":
            error = {"type": "Fail", "message": "bad input", "traceback": None}
            done = FinishParams(key, "w1", claimed.attempt, now, "failed", None, error, None, True)
            await driver.finish([done])
        elif key == "done-1":
            await driver.finish([FinishParams(key, "w1", claimed.attempt, now, "succeeded", {"ok": 1})])
    now = clock.now()
    timing = PlanTiming(schedule=EverySchedule(interval=3600, start=now))
    await ops.add_plan(Plan(plan_id="nightly", name="job.a", timing=timing))
    await ops.set_limit("job.a", max_running=2, rate="10/s")
    clock.advance(0.001)


def make_store() -> Operations:
    """A fresh store, the same one every time (a fake clock, fixed attempt tokens, a fixed id for
    the store's event writer: its events' ids name it)."""
    driver = MemoryDriver(clock=FakeClock(), events=True)
    driver.event_writer = EventWriter("store")
    asyncio.run(_seed(driver))
    return Operations(driver, clock=driver.clock)


def dump(ops: Operations) -> Any:
    async def read() -> Any:
        tasks = [t.model_dump(mode="json") for t in await ops.list_tasks(limit=1000)]
        for task in tasks:  # who set a status by hand: "cli" on the store, the API says "api:<token>"
            if task["marked"]:
                task["marked"]["by"] = "someone"
            if task["cancelled"]:  # who cancelled: the API records its token's name (issue 20)
                task["cancelled"].pop("by", None)
        plans = [p.model_dump(mode="json") for p in await ops.list_plans()]
        limits = [info.as_dict() for info in await ops.list_limits()]
        workers = [w.stop_requested for w in await ops.list_workers()]
        return tasks, plans, limits, workers

    return asyncio.run(read())


@pytest.fixture(scope="module")
def server() -> Iterator[ApiServer]:
    api = ApiServer(make_store())
    api.start()
    yield api
    api.stop()


def both_ways(server: ApiServer, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> Any:
    local = make_store()
    monkeypatch.setattr(cli_ops, "operations_override", lambda: local)
    on_store = cli(*args)
    monkeypatch.setattr(cli_ops, "operations_override", None)
    remote = make_store()
    server.serve(remote)
    over_api = cli(*args, "--api-url", server.url, "--token", ADMIN_TOKEN)
    return on_store, over_api, dump(local), dump(remote)


COMMANDS = [
    # tasks: listing and reading
    ["tasks", "ls"],
    ["tasks", "ls", "--json"],
    ["tasks", "ls", "--status", "failed"],
    ["tasks", "ls", "--key-prefix", "a-", "--limit", "2"],
    ["tasks", "ls", "--worker", "w1", "--json"],
    ["tasks", "ls", "--created-from", SINCE, "--name", "job.a"],
    ["tasks", "ls", "--status", "bogus"],
    ["tasks", "ls", "--limit", "5000"],
    ["tasks", "ls", "--name", '{"$gt": ""}'],
    ["tasks", "show", "boom-1"],
    ["tasks", "show", "done-1", "--json"],
    ["tasks", "show", "fam"],
    ["tasks", "show", "nope"],
    # tasks: changes
    ["tasks", "send", "job.new", "--key", "new-1", "--params", '{"a": 1}', "--priority", "3"],
    ["tasks", "send", "job.a", "--key", "a-1", "--json"],
    ["tasks", "send", "job.new", "--key", "new-2", "--allow-unknown"],
    ["tasks", "send", "job.a", "--key", "f-1", "--fair-key", "acme", "--aging", "30"],
    ["tasks", "send", "job.typed", "--key", "t-1", "--params", '{"n": "x"}'],
    ["tasks", "send", "job.typed", "--key", "t-2", "--params", '{"n": 2}'],
    ["tasks", "send", "job.a", "--key", "big", "--params", '{"x": "' + "y" * 600_000 + '"}'],
    ["tasks", "cancel", "a-1", "--reason", "not needed"],
    ["tasks", "cancel", "done-1"],
    ["tasks", "cancel", "a-1", "--reason", "x" * 3000],
    ["tasks", "pause", "a-2"],
    ["tasks", "pause", "run-1", "--stop-running"],
    ["tasks", "resume", "a-3"],
    ["tasks", "restart", "boom-1"],
    ["tasks", "restart", "a-1"],
    ["tasks", "restart", "boom-1", "done-1", "nope", "--force"],
    ["tasks", "restart", "--status", "failed", "--json"],
    ["tasks", "remove", "a-2"],
    ["tasks", "remove", "run-1"],
    ["tasks", "set-status", "a-3", "failed", "--reason", "by hand"],
    ["tasks", "set-status", "a-3", "bogus"],
    ["tasks", "set-status", "fam", "succeeded", "--child", "step.one"],
    ["tasks", "set-status", "fam", "succeeded", "--child", "nope"],
    ["tasks", "edit", "a-1", "--priority", "5", "--max-retries", "7"],
    ["tasks", "edit", "a-1", "--priority", "5", "--json"],
    ["tasks", "edit", "done-1", "--priority", "5"],
    ["tasks", "graph", "flow"],
    ["tasks", "graph", "flow", "--json"],
    ["tasks", "graph", "a-1"],
    ["tasks", "graph", "nope"],
    ["tasks", "restart-step", "flow", "step.one"],
    ["tasks", "restart-step", "flow", "nope"],
    # plans
    ["plans", "ls"],
    ["plans", "ls", "--json"],
    ["plans", "ls", "--state", "bogus"],
    ["plans", "show", "nightly"],
    ["plans", "show", "nope"],
    ["plans", "suspend", "nightly"],
    ["plans", "resume", "nightly"],
    ["plans", "skip", "nightly", "3"],
    ["plans", "skip", "nightly", "-1"],
    ["plans", "remove", "nightly"],
    ["plans", "add", "p2", "job.a", "--cron", "0 3 * * *", "--tz", "Europe/Berlin", "--json"],
    ["plans", "add", "nightly", "job.a", "--cron", "0 3 * * *"],
    # workers
    ["workers", "ls"],
    ["workers", "handlers"],
    ["workers", "handlers", "--json"],
    ["workers", "ls", "--json"],
    ["workers", "stop", "w-live"],
    ["workers", "stop", "nope"],
    # stats
    ["stats"],
    ["stats", "--json", "--window", "30", "--name", "job.a"],
    ["stats", "--window", "0"],
    ["stats", "--by-key"],
    ["stats", "--by-key", "--json", "--name", "job.x"],
    ["stats", "--by-key", "--name", "$bad"],
    # limits
    ["limits", "ls"],
    ["limits", "ls", "--json"],
    ["limits", "show", "job.a"],
    ["limits", "show", "nope"],
    ["limits", "set", "mail", "--max-running", "3", "--json"],
    ["limits", "set", "mail", "--names", "job.a", "--max-running", "3"],
    ["limits", "set", "mail", "--rate", "lots"],
    ["limits", "rm", "job.a"],
    ["limits", "rm", "nope"],
    # events
    ["events", "ls"],
    ["events", "ls", "--key", "a-1", "--json"],
    ["events", "ls", "--kind", "sent", "--limit", "2"],
    ["events", "ls", "--limit", "0"],
    ["events", "tail", "--since", SINCE, "--count", "3"],
    ["events", "tail", "--since", SINCE, "--count", "1", "--json", "--key", "a-2"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a)[:60] for a in COMMANDS])
def test_every_command_says_the_same_both_ways(
    server: ApiServer, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    on_store, over_api, store_after, api_store_after = both_ways(server, monkeypatch, args)
    assert over_api == on_store
    assert api_store_after == store_after


def test_the_commands_cover_every_operator_group() -> None:
    assert {a[0] for a in COMMANDS} == {"tasks", "plans", "workers", "stats", "limits", "events"}
    assert {a[1] for a in COMMANDS if a[0] == "tasks"} == {
        "ls", "show", "send", "cancel", "pause", "resume", "restart", "remove", "set-status", "edit",
        "graph", "restart-step",
    }  # fmt: skip


def test_refusals_come_back_as_the_store_words_them(
    server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_store, over_api, _, _ = both_ways(server, monkeypatch, ["tasks", "cancel", "done-1"])
    assert on_store[0] == over_api[0] == 1
    assert "error: cannot cancel task 'done-1': it is succeeded" in over_api[2]


# -- what only the API way meets --------------------------------------------------------------------


def test_nothing_answering_is_exit_3(refused_port: int) -> None:
    url = f"http://127.0.0.1:{refused_port}"
    code, _out, err = cli("tasks", "ls", "--api-url", url, "--token", ADMIN_TOKEN)
    assert code == 3, err
    assert err.startswith(f"error: cannot reach the mscheduler API at {url}") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("token", "args", "says"),
    [
        ("unknown-token-0123456789", ["tasks", "ls"], "refused the token: unknown token"),
        (READ_TOKEN, ["tasks", "cancel", "a-1"], "refused the token: this token may only read"),
        (PUBLISH_TOKEN, ["tasks", "ls"], "refused the token: a publish token may only send tasks"),
    ],
)
def test_a_refused_token_is_exit_4(server: ApiServer, token: str, args: list[str], says: str) -> None:
    server.serve(make_store())
    code, _out, err = cli(*args, "--api-url", server.url, "--token", token)
    assert code == 4, err
    assert says in err and err.count("\n") == 1


def test_a_publish_token_sends_tasks(server: ApiServer) -> None:
    store = make_store()
    server.serve(store)
    code, out, err = cli(
        "tasks", "send", "job.x", "--key", "x-1", "--api-url", server.url, "--token", PUBLISH_TOKEN
    )
    assert (code, out.strip()) == (0, "sent task 'x-1' (job.x)"), err
    assert asyncio.run(store.get_task("x-1")).name == "job.x"


def test_something_else_is_exit_5() -> None:
    with NotTheApi() as site:
        code, _out, err = cli("workers", "ls", "--api-url", site.url, "--token", ADMIN_TOKEN)
    assert code == 5, err
    assert "does not answer as an mscheduler API" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--api-url", "http://127.0.0.1:9"], "--api-url needs --token TOKEN (or MSCHEDULER_TOKEN)"),
        (["--api-url", "ftp://x", "--token", ADMIN_TOKEN], "an http:// or https:// address"),
        (
            ["--api-url", "http://127.0.0.1:9", "--token", ADMIN_TOKEN, "--mongodb-uri", "mongodb://x/"],
            "give --mongodb-uri or --api-url, not both",
        ),
        (
            ["--api-url", "http://127.0.0.1:9", "--token", ADMIN_TOKEN, "--database", "d"],
            "--database needs --mongodb-uri",
        ),
    ],
)
def test_usage_errors_are_exit_2(args: list[str], says: str) -> None:
    code, _out, err = cli("tasks", "ls", *args)
    assert code == 2, err
    assert says in err and err.count("\n") == 1


def test_the_environment_gives_the_api_and_the_token(server: ApiServer) -> None:
    from typer.testing import CliRunner

    from mscheduler.cli.main import full_app

    app = full_app()

    server.serve(make_store())
    env = {"MSCHEDULER_API_URL": server.url, "MSCHEDULER_TOKEN": READ_TOKEN, "COLUMNS": "200"}
    result = CliRunner(env=env).invoke(app, ["workers", "ls", "--json"])
    assert result.exit_code == 0, result.stderr
    assert '"w-live"' in result.stdout


def test_no_store_at_all_is_exit_2() -> None:
    from typer.testing import CliRunner

    from mscheduler.cli.main import full_app

    app = full_app()

    result = CliRunner(env={"MSCHEDULER_MONGODB_URI": None, "MSCHEDULER_API_URL": None}).invoke(
        app, ["tasks", "ls"]
    )
    assert result.exit_code == 2
    assert "no store: give --mongodb-uri URI" in result.stderr
