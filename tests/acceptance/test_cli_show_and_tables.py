"""``tasks show`` and ``tasks ls`` as an operator reads them: the result and the progress are
shown (not only with ``--json``), the attempt count agrees with the attempts table (cancelled and
released attempts included; what counts against the retries said apart), and tables cut no key —
plain lines in a pipe, folded lines in a terminal 80 columns wide."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from mscheduler import MemoryDriver, Operations, Task, TaskOption
from mscheduler.cli import common as cli_ops
from mscheduler.cli.render import task_rows
from mscheduler.drivers.base import AttemptReport, ClaimParams, FinishParams, PingParams
from tests.acceptance.support import cli

LONG = "receipt-2026-11-27-000042-customer-ada-lovelace-invoice"


async def _seed(driver: MemoryDriver) -> None:
    ops = Operations(driver)
    fan_out = TaskOption(concurrent_worker_cnt=2)
    for task in (Task(LONG, "job", {}), Task("done", "job", {}), Task("two", "job", {}, option=fan_out)):
        await ops.send(task, allow_unknown=True)
    now = datetime.now(UTC)
    [done] = await driver.claim(ClaimParams("w1", ["job"], now, ["a-done"], exclude_keys=[LONG, "two"]))
    await driver.finish([FinishParams("done", "w1", done.attempt, now, "succeeded", {"sent_to": "ada"})])
    # LONG: one attempt released by a graceful stop, then one that reported progress and was
    # cancelled by an operator
    for attempt in ("a-1", "a-2"):
        now = datetime.now(UTC)
        [claimed] = await driver.claim(ClaimParams("w1", ["job"], now, [attempt], exclude_keys=["two"]))
        assert claimed.key == LONG
        if attempt == "a-1":
            await driver.finish([FinishParams(LONG, "w1", attempt, now, "released")])
    report = AttemptReport(1, progress={"fraction": 0.4, "message": "row 400 of 1000"})
    await driver.ping(PingParams("w1", now, {now.replace(year=2099): {LONG: "a-2"}}, {LONG: report}))
    await ops.cancel(LONG, "operator")
    await driver.finish([FinishParams(LONG, "w1", "a-2", datetime.now(UTC), "cancelled")])
    now = datetime.now(UTC)
    for worker in ("w1", "w2"):
        [claimed] = await driver.claim(ClaimParams(worker, ["job"], now, [f"t-{worker}"]))
        await driver.finish([FinishParams("two", worker, claimed.attempt, now, "succeeded", worker)])


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryDriver]:
    driver = MemoryDriver()
    asyncio.run(_seed(driver))
    monkeypatch.setattr(cli_ops, "operations_override", lambda: Operations(driver))
    yield driver


def _row(out: str, field: str) -> str:
    [line] = [line for line in out.splitlines() if line.startswith(field + " ")]
    return line[len(field) :].strip()


def test_show_has_the_result_and_the_progress(store: MemoryDriver) -> None:
    code, out, err = cli("tasks", "show", "done")
    assert code == 0, err
    assert _row(out, "result") == '{"sent_to": "ada"}'
    assert _row(cli("tasks", "show", "two")[1], "result") == '["w1", "w2"]'  # every worker's
    out = cli("tasks", "show", LONG)[1]
    assert _row(out, "progress").startswith("40% row 400 of 1000 (at ")
    assert "result" not in [line.split(" ")[0] for line in out.splitlines()]


def test_the_attempt_count_agrees_with_the_attempts_table(store: MemoryDriver) -> None:
    out = cli("tasks", "show", LONG)[1]
    table = out.split("\nattempts\n", 1)[1].splitlines()
    assert [line.split()[:3] for line in table[1:]] == [["1", "w1", "released"], ["2", "w1", "cancelled"]]
    counted = _row(out.split("\nattempts\n", 1)[0], "attempts")
    assert counted == "2 (1 released, 1 cancelled; 0 of at most 4 counted against its retries)"
    [row] = [line for line in cli("tasks", "ls")[1].splitlines() if line.startswith(LONG)]
    assert row.split()[1:4] == ["job", "cancelled", "2"]


def test_in_a_pipe_a_table_is_plain_lines_with_every_key_whole(store: MemoryDriver) -> None:
    out = cli("tasks", "ls")[1]  # CliRunner's stdout is not a terminal
    lines = out.splitlines()
    assert lines[0] == "tasks (3)" and lines[1].split() == [
        "key", "name", "status", "attempts", "paused", "updated", "last", "error",
    ]  # fmt: skip
    assert any(line.startswith(LONG + "  ") for line in lines)
    assert "…" not in out and "│" not in out and "─" not in out


def test_in_a_terminal_80_columns_wide_a_long_key_folds_rather_than_being_cut(
    store: MemoryDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    terminal: Any = cli_ops.TerminalConsole(file=screen, force_terminal=True, width=80, soft_wrap=True)
    tasks = asyncio.run(Operations(store).list_tasks())
    terminal.print(task_rows(tasks))
    shown = screen.getvalue()
    assert "…" not in shown
    cells = [line.split("│")[1].strip() for line in shown.splitlines() if line.count("│") > 2]
    assert LONG in "".join(cells)  # its pieces, one under the other, make the whole key
    plain = io.StringIO()
    Console(file=plain, force_terminal=True, width=80).print(task_rows(tasks))
    assert "…" in plain.getvalue()  # what a plain Rich console does: the key is cut
