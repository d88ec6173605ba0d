"""The operator commands (``tasks``, ``plans``, ``workers``, ``stats``) on an in-process store:
tables and ``--json``, one-line refusals with their exit codes, operator injection refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from mscheduler import (
    Consumer,
    Fail,
    MemoryDriver,
    Operations,
    Publisher,
    Task,
    TaskOption,
    TaskStatus,
)
from mscheduler.cli import common as cli_ops
from mscheduler.cli.main import full_app
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import WorkerInfo
from tests.acceptance.support import QUICK_RUN, cli, command, run

app = full_app()


async def _seed(driver: MemoryDriver) -> None:
    publisher = Publisher(driver)
    for key in ("a-1", "a-2", "a-3"):
        assert await publisher.send(Task(key, "job.a", {"n": key}))
    assert await publisher.send(Task("boom-1", "job.boom", {}))
    consumer = Consumer(driver, worker_id="w-boom", concurrency=1)

    async def boom(params: Any) -> None:
        raise Fail("bad input")

    consumer.register("job.boom", boom)
    async with consumer:
        for _ in range(400):
            info = await publisher.get("boom-1")
            if info is not None and info.status is TaskStatus.FAILED:
                break
            await asyncio.sleep(0.01)
    now = datetime.now(UTC)
    await driver.register_worker(WorkerInfo("w-live", "host-1", 42, ("job.a",), 4, now, ("gpu",)))
    ops = Operations(driver)
    await ops.add_plan(
        Plan(
            plan_id="nightly",
            name="job.a",
            timing=PlanTiming(schedule=EverySchedule(interval=3600, start=now)),
        )
    )


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryDriver]:
    driver = MemoryDriver()
    asyncio.run(_seed(driver))
    monkeypatch.setattr(cli_ops, "operations_override", lambda: Operations(driver))
    yield driver


def status_of(driver: MemoryDriver, key: str) -> str | None:
    info = asyncio.run(Operations(driver).get_task(key)) if key in _keys(driver) else None
    return None if info is None else info.status.value


def _keys(driver: MemoryDriver) -> set[str]:
    return {t.key for t in asyncio.run(Operations(driver).list_tasks(limit=1000))}


def test_tasks_ls_table_filters_and_json(store: MemoryDriver) -> None:
    code, out, err = cli("tasks", "ls")
    assert code == 0, err
    assert "tasks (4)" in out and "a-1" in out and "boom-1" in out and "Fail: bad input" in out
    code, out, err = cli("tasks", "ls", "--status", "failed", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["key"] for r in rows] == ["boom-1"] and rows[0]["status"] == "failed"
    code, out, _ = cli("tasks", "ls", "--name", "job.a", "--limit", "2", "--json")
    assert code == 0 and [r["key"] for r in json.loads(out)] == ["a-1", "a-2"]


def test_tasks_ls_by_finish_time_and_group(store: MemoryDriver) -> None:
    started = asyncio.run(Operations(store).get_task("a-1")).create_time.isoformat()
    asyncio.run(
        Publisher(store).send(Task("gpu-1", "job.a", {}, option=TaskOption(specific_groups=("gpu",))))
    )
    assert cli("tasks", "cancel", "a-2")[0] == 0  # finished after boom-1
    code, out, err = cli("tasks", "ls", "--finished-from", started, "--json")
    assert code == 0, err
    assert [r["key"] for r in json.loads(out)] == ["boom-1", "a-2"]
    code, out, err = cli("tasks", "ls", "--finished-from", started)
    assert code == 0 and "finished" in out.splitlines()[1] and "a-2" in out and "a-1" not in out, out
    code, out, err = cli("tasks", "ls", "--finished-from", started, "--limit", "1", "--json")
    assert [r["key"] for r in json.loads(out)] == ["boom-1"] and err.startswith("next_cursor: ")
    cursor = err.split()[1]
    code, out, _ = cli("tasks", "ls", "--finished-from", started, "--cursor", cursor, "--json")
    assert code == 0 and [r["key"] for r in json.loads(out)] == ["a-2"]
    boom_done = json.loads(cli("tasks", "show", "boom-1", "--json")[1])["finish_time"]
    code, out, _ = cli("tasks", "ls", "--finished-to", boom_done, "--json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = cli("tasks", "ls", "--group", "gpu", "--json")
    assert code == 0 and [r["key"] for r in json.loads(out)] == ["gpu-1"]
    code, out, _ = cli("tasks", "ls", "--group", "gpu", "--finished-from", started, "--json")
    assert code == 0 and json.loads(out) == []


def test_tasks_show_prints_the_attempt_timeline(store: MemoryDriver) -> None:
    code, out, err = cli("tasks", "show", "boom-1")
    assert code == 0, err
    assert "task boom-1" in out and "w-boom" in out and "Fail: bad input" in out
    code, out, _ = cli("tasks", "show", "boom-1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["key"] == "boom-1"
    assert doc["worker_states"][0]["worker_id"] == "w-boom"
    assert doc["worker_states"][0]["error"]["message"] == "bad input"


def test_task_controls(store: MemoryDriver) -> None:
    assert cli("tasks", "pause", "a-1")[:2] == (0, "paused task 'a-1' (pending)\n")
    assert cli("tasks", "resume", "a-1")[0] == 0
    code, out, _ = cli("tasks", "cancel", "a-1", "--reason", "not needed")
    assert code == 0 and "cancelled task 'a-1' (now cancelled)" in out
    assert status_of(store, "a-1") == "cancelled"
    code, out, _ = cli("tasks", "restart", "a-1")
    assert code == 0 and "(now pending)" in out
    assert cli("tasks", "restart", "boom-1")[0] == 0
    assert cli("tasks", "remove", "a-2") == (0, "removed task 'a-2'\n", "")
    assert "a-2" not in _keys(store)


def test_set_status_by_hand_of_a_task_and_of_a_child(store: MemoryDriver) -> None:
    code, out, _ = cli("tasks", "set-status", "a-3", "succeeded", "--reason", "done by hand")
    assert (code, out) == (0, "task 'a-3' is now succeeded\n")
    marked = asyncio.run(Operations(store).get_task("a-3")).marked
    assert marked is not None and (marked["reason"], marked["by"]) == ("done by hand", "cli")

    asyncio.run(
        Publisher(store).send(Task("etl", "job.etl", children=["fetch", "load"], children_mode="sequential"))
    )
    assert cli("tasks", "set-status", "etl", "--child", "fetch", "succeeded")[:2] == (
        0,
        "task 'etl/fetch' is now succeeded\n",
    )
    children = {c.name: c.status.value for c in asyncio.run(Operations(store).get_task("etl")).children or []}
    assert children == {"fetch": "succeeded", "load": "pending"}, "the next step was unblocked"
    code, _, err = cli("tasks", "set-status", "etl", "--child", "nope", "failed")
    assert code == 2 and err.startswith(
        "error: task 'etl' has no child named 'nope' (its children: 'fetch', 'load')"
    )
    assert cli("tasks", "set-status", "etl", "--child", "load", "cancelled")[:2] == (
        0,
        "task 'etl/load' is now cancelled\n",
    )
    assert cli("tasks", "set-status", "etl", "--child", "load", "pending")[:2] == (
        0,
        "task 'etl/load' is now pending\n",
    )
    code, _, err = cli("tasks", "set-status", "etl", "succeeded")
    assert code == 1 and "a task with children takes its status from them" in err


def test_pause_can_stop_the_running_attempt(store: MemoryDriver) -> None:
    async def claim() -> None:
        from mscheduler.drivers.base import ClaimParams

        now = datetime.now(UTC)
        assert [c.key for c in await store.claim(ClaimParams("w-x", ["job.a"], now, ["w-x#1"]))] == ["a-1"]

    asyncio.run(claim())
    assert status_of(store, "a-1") == "running"
    stopped = cli("tasks", "pause", "a-1", "--stop-running")[:2]
    assert stopped == (0, "paused task 'a-1' (running; 1 running attempt(s) told to stop)\n")
    info = asyncio.run(Operations(store).get_task("a-1"))
    # the attempt keeps its slot until its worker settles it released (issue 17 A2)
    assert info.paused and [e.status.value for e in info.worker_states] == ["running"]
    assert store._tasks["a-1"]["state"]["stop"]["attempts"] == ["w-x#1"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["tasks", "show", "nope"], 1, "error: no task with key 'nope'"),
        (["tasks", "cancel", "boom-1"], 1, "error: cannot cancel task 'boom-1': it is failed"),
        (["tasks", "restart", "a-1"], 1, "error: cannot restart task 'a-1': it is pending"),
        (
            ["tasks", "set-status", "a-1", "running"],
            2,
            "error: status: one of succeeded, failed, got 'running'",
        ),
        (["tasks", "set-status", "boom-1", "failed"], 1, "error: cannot set status failed task 'boom-1'"),
        (["tasks", "set-status", "a-1", "failed", "--child", "x"], 2, "error: task 'a-1' has no children"),
        (["tasks", "ls", "--status", "lost"], 2, "error: status: unknown status (one of"),
        (["tasks", "ls", "--limit", "0"], 2, "error: limit: must be an integer from 1 to 1000"),
        (["tasks", "ls", "--name", "bad name!"], 2, "error: name: invalid task name"),
        (["tasks", "ls", "--group", "gpu eu"], 2, "error: group: invalid group: 1-200"),
        (["tasks", "ls", "--finished-from", "yesterday"], 2, "error: --finished-from: an ISO-8601 time"),
        (
            ["tasks", "ls", "--finished-to", "2030-01-01T00:00:00"],
            2,
            "error: --finished-to: an ISO-8601 time",
        ),
        (
            [
                "tasks",
                "ls",
                "--finished-from",
                "2030-01-02T00:00:00Z",
                "--finished-to",
                "2030-01-01T00:00:00Z",
            ],
            2,
            "error: finished_to: must be later than finished_from",
        ),
        (["plans", "show", "nope"], 1, "error: no plan with id 'nope'"),
        (["plans", "suspend", "$where"], 2, "error: plan_id: plan_id must not contain control characters"),
        (["plans", "skip", "--", "nightly", "-1"], 2, "error: n: must be an integer from 0"),
        (["plans", "ls", "--state", "bogus"], 2, "error: state: unknown plan state 'bogus'"),
        (["workers", "stop", "nobody"], 1, "error: no running worker with id 'nobody'"),
        (["workers", "stop", "$ne"], 2, "error: invalid worker id (1-200 characters"),
        (["limits", "show", "nope"], 1, "error: no limit with key 'nope'"),
        (["limits", "rm", "nope"], 1, "error: no limit with key 'nope'"),
        (["limits", "show", "$where"], 2, "error: key: invalid task name: 1-200 characters"),
        (["limits", "set", "job.a"], 2, "error: invalid limit: a limit needs max_running, rate or both\n"),
        (["limits", "set", "job.a", "--rate", "fast"], 2, "error: invalid limit: rate: invalid rate:"),
        (
            ["limits", "set", "job.a", "--max-running", "-1"],
            2,
            "error: invalid limit: max_running: Input should be",
        ),
        (
            ["limits", "set", "job.a", "--names", "a,,b", "--max-running", "1"],
            2,
            "error: invalid limit: names: invalid task name: 1-200",
        ),
    ],
)
def test_refusals_are_one_line_with_their_exit_code(
    store: MemoryDriver, args: list[str], code: int, message: str
) -> None:
    got, out, err = cli(*args)
    assert got == code, (out, err)
    assert err.startswith(message), err
    assert err.count("\n") == 1 and "Traceback" not in out + err


@pytest.mark.parametrize(
    "args",
    [
        ["tasks", "ls", "--status", '{"$gt": ""}'],
        ["tasks", "ls", "--name", '{"$gt": ""}'],
        ["tasks", "ls", "--group", '{"$gt": ""}'],
        ["tasks", "ls", "--group", "$where"],
        ["tasks", "ls", "--finished-from", '{"$gt": ""}'],
        ["tasks", "cancel", '{"$gt": ""}'],
        ["tasks", "set-status", '{"$gt": ""}', "succeeded"],
        ["tasks", "set-status", "a-1", '{"$gt": ""}'],
        ["tasks", "remove", '{"$gt": ""}', "--force"],
        ["plans", "remove", '{"$gt": ""}'],
        ["workers", "stop", '{"$gt": ""}'],
    ],
)
def test_operator_injection_is_refused_and_changes_nothing(store: MemoryDriver, args: list[str]) -> None:
    before = asyncio.run(Operations(store).count_by_status())
    code, out, err = cli(*args)
    assert code in (1, 2), (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert asyncio.run(Operations(store).count_by_status()) == before
    assert len(asyncio.run(Operations(store).list_plans())) == 1


def test_plans_commands(store: MemoryDriver) -> None:
    code, out, _ = cli("plans", "ls")
    assert code == 0 and "nightly" in out and "active" in out
    assert cli("plans", "suspend", "nightly")[1] == "suspended plan 'nightly' (suspended)\n"
    code, out, _ = cli("plans", "ls", "--state", "suspended", "--json")
    assert code == 0 and [p["plan_id"] for p in json.loads(out)] == ["nightly"]
    assert cli("plans", "resume", "nightly")[1] == "resumed plan 'nightly' (active)\n"
    assert cli("plans", "skip", "nightly", "3")[1] == "plan 'nightly' skips its next 3 occurrence(s)\n"
    code, out, _ = cli("plans", "show", "nightly", "--json")
    assert code == 0 and json.loads(out)["skip_next"] == 3
    assert "plan nightly" in cli("plans", "show", "nightly")[1]
    assert cli("plans", "remove", "nightly") == (0, "removed plan 'nightly'\n", "")
    assert cli("plans", "ls", "--json")[1].strip() == "[]"


def test_workers_and_stats(store: MemoryDriver) -> None:
    code, out, _ = cli("workers", "ls")
    assert code == 0 and "w-live" in out and "host-1" in out and "gpu" in out
    code, out, _ = cli("workers", "ls", "--json")
    workers = {w["worker_id"]: w for w in json.loads(out)}
    assert workers["w-live"]["live"] is True and workers["w-boom"]["live"] is False
    assert (workers["w-live"]["groups"], workers["w-boom"]["groups"]) == (["gpu"], [])
    assert cli("workers", "stop", "w-live") == (0, "asked worker 'w-live' to stop\n", "")
    assert json.loads(cli("workers", "ls", "--json")[1])[1]["stop_requested"] is True
    code, out, _ = cli("stats", "--json")
    assert code == 0 and json.loads(out)["counts"] == {
        "pending": 3,
        "running": 0,
        "succeeded": 0,
        "failed": 1,
        "expired": 0,
        "cancelled": 0,
    }
    code, out, _ = cli("stats")
    assert code == 0 and "total" in out and "4" in out


def test_limits_commands(store: MemoryDriver) -> None:
    code, out, err = cli("limits", "set", "job.a", "--max-running", "4")
    assert (code, out, err) == (0, "set limit 'job.a' on job.a: max running 4\n", "")
    code, out, err = cli("limits", "set", "partner", "--names", "job.boom, job.b", "--rate", "10/s", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["key"], doc["names"], doc["max_running"], doc["rate"]) == (
        "partner",
        ["job.boom", "job.b"],
        None,
        "10/1000ms",
    )
    code, out, _ = cli("limits", "ls")
    assert code == 0 and "limits (2)" in out and "job.a" in out and "10 per 1 s" in out
    code, out, _ = cli("limits", "ls", "--json")
    assert code == 0 and [d["key"] for d in json.loads(out)] == ["job.a", "partner"]
    code, out, _ = cli("limits", "show", "job.a")
    assert code == 0 and "limit job.a" in out and "slots" in out
    code, out, _ = cli("limits", "show", "job.a", "--json")
    assert code == 0 and json.loads(out)["max_running"] == 4 and json.loads(out)["holders"] == []
    assert cli("limits", "rm", "job.a") == (0, "removed limit 'job.a'\n", "")
    assert [i.limit.key for i in asyncio.run(Operations(store).list_limits())] == ["partner"]


def test_refused_limit_input_writes_nothing(store: MemoryDriver) -> None:
    asyncio.run(Operations(store).set_limit("held", names=["job.boom"], max_running=1))
    for args in (
        ["limits", "set", "other", "--names", "job.boom", "--max-running", "1"],
        ["limits", "set", '{"$gt": ""}', "--max-running", "1"],
        ["limits", "set", "held", "--max-running", "x"],
        ["limits", "set", "held", "--rate", "0/s"],
    ):
        code, out, err = cli(*args)
        assert code == 2 and "Traceback" not in out + err, (args, out, err)
    [info] = asyncio.run(Operations(store).list_limits())
    assert (info.limit.key, info.limit.max_running) == ("held", 1)


def test_a_missing_uri_is_a_usage_error() -> None:
    result = CliRunner(env={"MSCHEDULER_MONGODB_URI": None}).invoke(app, ["stats"])
    assert result.exit_code == 2
    assert "--mongodb-uri" in result.stderr


def test_an_unreachable_server_exits_3_in_one_line() -> None:
    uri = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"
    code, out, err, seconds = run([*command(), "tasks", "ls", "--mongodb-uri", uri])
    assert code == 3, (out, err)
    assert err.startswith("error: cannot reach MongoDB at mongodb://127.0.0.1:1/"), err
    assert err.count("\n") == 1 and "Traceback" not in out + err
    assert seconds < QUICK_RUN
    code, _, err, _ = run([*command(), "stats"], MSCHEDULER_MONGODB_URI="http://x")
    assert code == 2 and "invalid MongoDB URI" in err


COMMANDS = [
    ["tasks"],
    *(["tasks", c] for c in ("ls", "show", "cancel", "pause", "resume", "restart", "remove", "set-status")),
    ["maintenance"],
    ["plans"],
    *(["plans", c] for c in ("ls", "show", "suspend", "resume", "skip", "remove")),
    ["workers"],
    ["workers", "ls"],
    ["workers", "stop"],
    ["stats"],
    ["limits"],
    *(["limits", c] for c in ("ls", "show", "set", "rm")),
]


@pytest.mark.parametrize("subcommand", COMMANDS, ids=" ".join)
def test_every_new_help_fits_80_columns(subcommand: list[str]) -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*subcommand, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    too_long = [line for line in result.stdout.splitlines() if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    for unreadable in ("<str>", "<int range>", "…", "--no-json", "--no-force"):
        assert unreadable not in result.stdout, result.stdout
