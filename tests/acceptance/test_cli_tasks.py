"""The operator commands that send and change: ``tasks send``, ``tasks edit``, ``tasks restart`` of
many tasks, ``tasks show`` with its extras, ``plans add``, ``events ls`` / ``events tail`` — on an
in-process store (``cli_ops.operations_override``): bad input is one line, exit 2, nothing
written."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mscheduler import Consumer, Fail, MemoryDriver, Operations, Publisher, Task, TaskStatus
from mscheduler.cli import common as cli_ops
from mscheduler.cli.main import full_app
from mscheduler.drivers.base import ClaimParams, WorkerInfo
from tests.acceptance.support import cli
from tests.acceptance.test_cli_operations import COMMANDS

app = full_app()


async def _fail_all(driver: MemoryDriver, keys: list[str], name: str = "job.boom") -> None:
    publisher = Publisher(driver)
    for key in keys:
        await publisher.send(Task(key, name, {}))
    consumer = Consumer(driver, worker_id="w-boom", concurrency=4, poll_interval=0.01)

    async def boom(params: Any) -> None:
        raise Fail("bad input")

    consumer.register(name, boom)
    async with consumer:
        for _ in range(1000):
            infos = await Operations(driver).get_tasks(keys)
            if all(i.status is TaskStatus.FAILED for i in infos.values()):
                break
            await asyncio.sleep(0.01)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryDriver]:
    driver = MemoryDriver(events=True)
    asyncio.run(_fail_all(driver, ["boom-1", "boom-2", "boom-3"]))
    asyncio.run(_fail_all(driver, ["other-1"], name="job.other"))
    asyncio.run(driver.register_worker(WorkerInfo("w-live", "h", 1, ["job.a"], 1, datetime.now(UTC))))
    monkeypatch.setattr(cli_ops, "operations_override", lambda: Operations(driver))
    yield driver


def info(driver: MemoryDriver, key: str) -> Any:
    return asyncio.run(Operations(driver).get_task(key))


def keys(driver: MemoryDriver) -> set[str]:
    return {t.key for t in asyncio.run(Operations(driver).list_tasks(limit=1000))}


def test_tasks_send_through_the_publisher(store: MemoryDriver) -> None:
    code, out, err = cli(
        "tasks", "send", "job.a", "--key", "s-1", "--params", '{"n": 1}', "--priority", "5",
        "--max-retries", "2", "--run-at", "2030-01-01T00:00:00Z", "--specific-worker", "w-9",
    )  # fmt: skip
    assert code == 0, err
    assert out == "sent task 's-1' (job.a)\n"
    task = info(store, "s-1")
    assert task.params == {"n": 1} and task.option.priority == 5
    assert task.option.max_unexpected_retries == 2 and task.option.specific_worker_ids == ("w-9",)
    assert task.option.run_at is not None and task.option.run_at.year == 2030
    assert cli("tasks", "send", "job.a", "--key", "s-1")[:2] == (0, "task 's-1' exists (left as it is)\n")
    code, out, _ = cli("tasks", "send", "job.a", "--key", "s-2", "--json")
    assert code == 0 and json.loads(out) == {"key": "s-2", "created": True}
    code, _, err = cli("tasks", "send", "job.a", "--key", "s-3", "--fair-key", "acme", "--aging", "60")
    assert code == 0, err
    assert info(store, "s-3").option.fair_key == "acme"
    assert info(store, "s-3").option.aging == timedelta(minutes=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key", "x", "--params", "{nope"], "error: --params: not JSON"),
        (["--key", "x", "--params", '{"$gt": ""}'], "error: invalid task 'x': key '$gt' in params"),
        (["--key", "x", "--priority", "99999999"], "error: invalid TaskOption: priority"),
        (["--key", "x", "--run-at", "tomorrow"], "error: --run-at: an ISO-8601 time"),
        (["--key", "", "--params", "{}"], "error: invalid task: key must be"),
        (["--key", "x", "--bogus", "1"], "No such option: --bogus"),
        (["--key", "x", "--fair-key", "a|b"], "error: invalid TaskOption: invalid fair_key 'a|b'"),
        (["--key", "x", "--priority", "-1", "--aging", "5"], "error: invalid TaskOption"),
    ],
)
def test_tasks_send_refuses_bad_input_in_one_line(store: MemoryDriver, args: list[str], message: str) -> None:
    before = keys(store)
    code, out, err = cli("tasks", "send", "job.a", *args)
    assert code == 2, (out, err)
    assert message in err, err
    assert "Traceback" not in out + err
    assert keys(store) == before
    if message.startswith("error: "):
        assert err.startswith(message) and err.count("\n") == 1


def test_tasks_send_of_a_bad_name_is_one_line(store: MemoryDriver) -> None:
    code, _, err = cli("tasks", "send", "bad name!", "--key", "x")
    assert code == 2 and err.startswith("error: invalid task 'x': invalid task name") and err.count("\n") == 1


def test_tasks_send_is_checked_at_the_door(store: MemoryDriver) -> None:
    """A name no live worker handles is refused with the handled names (exit 2, nothing
    written) unless --allow-unknown says it is expected; the refusal names the CLI's flag."""
    before = keys(store)
    code, out, err = cli("tasks", "send", "job.aa", "--key", "typo-1")
    assert code == 2 and out == "", err
    assert err == (
        "error: no live worker handles tasks named 'job.aa' (names handled now: job.a); if a worker "
        "for it is on its way, send it with --allow-unknown\n"
    )
    assert keys(store) == before
    assert cli("tasks", "send", "job.aa", "--key", "typo-1", "--allow-unknown")[:2] == (
        0,
        "sent task 'typo-1' (job.aa)\n",
    )


def test_tasks_send_reads_params_from_a_file_or_stdin(
    store: MemoryDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = {"rows": ["x" * 100] * 2000}  # about 200 KB: more than a command line takes
    path = tmp_path / "params.json"
    path.write_text(json.dumps(big))
    assert cli("tasks", "send", "job.a", "--key", "f-1", "--params", f"@{path}")[0] == 0
    assert info(store, "f-1").params == big
    result = CliRunner().invoke(
        app, ["tasks", "send", "job.a", "--key", "f-2", "--params", "-"], input='{"n": 2}'
    )
    assert result.exit_code == 0, result.stderr
    assert info(store, "f-2").params == {"n": 2}
    code, _, err = cli("tasks", "send", "job.a", "--key", "f-3", "--params", f"@{tmp_path / 'missing.json'}")
    assert code == 2 and err.startswith("error: --params: cannot read ") and "No such file" in err
    path.write_text("{not json")
    code, _, err = cli("tasks", "send", "job.a", "--key", "f-3", "--params", f"@{path}")
    assert code == 2 and err.startswith("error: --params: not JSON")


def test_refusals_name_the_command_lines_flags(store: MemoryDriver) -> None:
    """A rule that ``Operations`` words with a keyword argument reads as the CLI's flag."""
    asyncio.run(Publisher(store).send(Task("r-1", "job.a", {})))
    asyncio.run(store.claim(ClaimParams("w-9", ["job.a"], datetime.now(UTC), ["att-1"])))
    code, _, err = cli("tasks", "remove", "r-1")
    assert code == 1 and "--force" in err and "force=True" not in err, err


def test_tasks_edit(store: MemoryDriver) -> None:
    assert cli("tasks", "send", "job.a", "--key", "e-1")[0] == 0
    code, out, err = cli("tasks", "edit", "e-1", "--priority", "7", "--max-retries", "4")
    assert code == 0, err
    assert out.startswith("edited task 'e-1': max_unexpected_retries=4, priority=7")
    task = info(store, "e-1")
    assert task.option.priority == 7 and task.option.max_unexpected_retries == 4
    code, out, _ = cli("tasks", "edit", "e-1", "--specific-worker", "w-1", "--json")
    assert code == 0 and json.loads(out)["specific_worker_ids"] == ["w-1"]
    assert cli("tasks", "edit", "e-1", "--any-worker")[0] == 0
    assert info(store, "e-1").option.specific_worker_ids == ()

    assert cli("tasks", "edit", "e-1")[:1] == (2,)
    code, _, err = cli("tasks", "edit", "e-1", "--priority", "99999999")
    assert code == 2 and err.startswith("error: invalid OptionChange: priority")
    code, _, err = cli("tasks", "edit", "boom-1", "--priority", "1")
    assert code == 1 and err.startswith("error: cannot edit task 'boom-1': it is failed")
    assert info(store, "e-1").option.priority == 7


def test_tasks_restart_of_many_keys_and_by_status(store: MemoryDriver) -> None:
    assert cli("tasks", "send", "job.a", "--key", "p-1")[0] == 0
    code, out, err = cli("tasks", "restart", "boom-1", "p-1", "gone")
    assert code == 1, err
    assert "p-1: refused (it is pending: only a failed" in out
    assert "gone: no such task" in out
    assert out.endswith("restarted 1 of 3 task(s)\n")
    assert info(store, "boom-1").status is TaskStatus.PENDING

    code, out, err = cli("tasks", "restart", "--status", "failed", "--name", "job.boom", "--json")
    assert code == 0, err
    assert sorted(o["key"] for o in json.loads(out)) == ["boom-2", "boom-3"]
    assert "restarting" not in err  # no progress bar with --json
    assert info(store, "other-1").status is TaskStatus.FAILED  # another name: left alone

    assert cli("tasks", "restart", "--status", "failed")[0] == 0
    assert info(store, "other-1").status is TaskStatus.PENDING
    for args in (["--status", "failed", "boom-1"], [], ["--name", "job.boom"]):
        code, _, err = cli("tasks", "restart", *args)
        assert code == 2 and err.startswith("error: give KEY... or --status"), args
    code, _, err = cli("tasks", "restart", "--status", "lost")
    assert code == 2 and err.startswith("error: status: unknown status (one of")


def test_tasks_show_has_the_last_events_and_state(store: MemoryDriver) -> None:
    code, out, err = cli("tasks", "show", "boom-1")
    assert code == 0, err
    assert "last events (3)" in out
    for kind in ("sent", "claimed", "failed"):
        assert kind in out
    doc = json.loads(cli("tasks", "show", "boom-1", "--json")[1])
    assert [e["kind"] for e in doc["events"]] == ["sent", "claimed", "failed"]


def test_plans_add_from_flags_and_a_file(store: MemoryDriver, tmp_path: Path) -> None:
    code, out, err = cli("plans", "add", "hourly", "job.a", "--cron", "0 * * * *", "--tz", "Europe/Berlin")
    assert code == 0, err
    assert "plan hourly" in out and "active" in out
    code, out, err = cli("plans", "add", "often", "job.a", "--every", "90", "--params", '{"n": 2}', "--json")
    assert code == 0, err
    assert json.loads(out)["plan_id"] == "often"
    assert cli("plans", "add", "once", "job.a", "--at", "2031-05-01T08:00:00+02:00")[0] == 0
    path = tmp_path / "plan.json"
    schedule = {"kind": "every", "interval": 60, "start": "2030-01-01T00:00:00Z"}
    path.write_text(json.dumps({"plan_id": "from-file", "name": "job.a", "timing": {"schedule": schedule}}))
    assert cli("plans", "add", "--file", str(path))[0] == 0
    ops = Operations(store)
    assert {p.plan_id for p in asyncio.run(ops.list_plans())} == {"hourly", "often", "once", "from-file"}

    bad = tmp_path / "bad.json"
    cron = {"kind": "cron", "expression": "99 * * * *"}
    bad.write_text(json.dumps({"plan_id": "x", "name": "job.a", "timing": {"schedule": cron}}))
    for args in (
        ["x", "job.a"],
        ["x", "job.a", "--cron", "0 * * * *", "--every", "60"],
        ["x", "job.a", "--cron", "99 * * * *"],
        ["x", "job.a", "--every", "60", "--tz", "Mars/Olympus"],
        ["x", "job.a", "--at", "2031-05-01"],
        ["x", "job.a", "--every", "60", "--params", "[1,"],
        ["--file", str(bad)],
        ["--file", str(tmp_path / "missing.json")],
        ["x", "job.a", "--file", str(path)],
    ):
        code, out, err = cli("plans", "add", *args)
        assert code == 2, (args, out, err)
        assert err.startswith("error: ") and err.count("\n") == 1, (args, err)
    assert len(asyncio.run(ops.list_plans())) == 4
    code, _, err = cli("plans", "add", "hourly", "job.a", "--every", "60")
    assert code == 2 and "hourly" in err  # an id that exists


def test_events_ls_and_tail(store: MemoryDriver) -> None:
    code, out, err = cli("events", "ls", "--key", "boom-1")
    assert code == 0, err
    assert "events (3)" in out and "w-boom" in out
    code, out, _ = cli("events", "ls", "--kind", "failed", "--json")
    assert code == 0
    assert sorted(e["key"] for e in json.loads(out)) == ["boom-1", "boom-2", "boom-3", "other-1"]
    code, out, _ = cli("events", "ls", "--name", "job.other", "--limit", "1")
    assert code == 0 and "more: --skip 1" in out

    start = asyncio.run(Operations(store).get_task("boom-1")).create_time.isoformat()
    code, out, err = cli("events", "tail", "--since", start, "--kind", "failed", "--count", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and all(" failed " in line for line in lines)
    code, out, _ = cli("events", "tail", "--since", start, "--key", "boom-2", "--count", "1", "--json")
    assert code == 0 and json.loads(out)["kind"] == "sent"

    for args in (["ls", "--kind", "exploded"], ["ls", "--since", "yesterday"], ["tail", "--key", "a\x00"]):
        code, _, err = cli("events", *args)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (args, err)


NEW_COMMANDS = [
    ["tasks", "send"],
    ["tasks", "edit"],
    ["plans", "add"],
    ["events"],
    ["events", "ls"],
    ["events", "tail"],
]


@pytest.mark.parametrize("subcommand", NEW_COMMANDS, ids=" ".join)
def test_every_new_help_fits_80_columns(subcommand: list[str]) -> None:
    assert subcommand not in COMMANDS
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*subcommand, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    too_long = [line for line in result.stdout.splitlines() if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    for unreadable in ("<str>", "<int range>", "…", "--no-json", "--no-force"):
        assert unreadable not in result.stdout, result.stdout
