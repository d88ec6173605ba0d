"""``mscheduler stats`` on an in-process store: tables, ``--json``, ``--window``, ``--name``, and
``Operations.stats`` refusing bad input (exit 2)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from rich.console import Console

from mscheduler import FakeClock, InvalidInput, MemoryDriver, Operations
from mscheduler.cli import common as cli_ops
from mscheduler.cli.stats import stats_with_progress
from mscheduler.domain.stats import COUNT_STEP
from tests.acceptance.support import cli
from tests.conformance.support import Store


async def _seed(driver: MemoryDriver, clock: FakeClock) -> None:
    store = Store(driver, clock)
    for i in range(3):
        await store.add(f"ok-{i}", "job.ok")
        claimed = await store.claim_one("w", names=["job.ok"])
        assert claimed is not None
        clock.advance(2)
        assert await store.done(claimed, "w")
    await store.add("wait-1", "job.wait")
    clock.advance(30)
    await store.add("acme-1", "job.wait", fair_key="acme")
    await store.add("acme-2", "job.wait", fair_key="acme")
    clock.advance(60)  # wait-1 has been due for 90 s, acme's tasks for 60 s


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryDriver]:
    clock = FakeClock()
    driver = MemoryDriver(clock)
    asyncio.run(_seed(driver, clock))
    monkeypatch.setattr(cli_ops, "operations_override", lambda: Operations(driver, clock=clock))
    yield driver


def test_stats_tables_and_json(store: MemoryDriver) -> None:
    code, out, _ = cli("stats")
    assert code == 0, out
    assert "tasks by status" in out and "total" in out
    assert "job.ok" in out and "100.0%" in out and "2.0s" in out  # first try, p50 2 s
    assert "oldest due pending task waiting: 1m30s" in out
    assert "throughput, last hour: 3 tasks" in out

    code, out, _ = cli("stats", "--json", "--window", "5", "--name", "job.wait")
    data = json.loads(out)
    assert code == 0 and data["window_seconds"] == 300
    assert [n["name"] for n in data["names"]] == ["job.wait"]
    assert data["counts"]["pending"] == 3 and data["oldest_pending_age"] == 90.0
    assert len(data["throughput"]) == 60


def test_stats_by_fairness_key(store: MemoryDriver) -> None:
    code, out, _ = cli("stats", "--by-key")
    assert code == 0, out
    assert "due tasks by fairness key" in out and "acme" in out and "1m00s" in out
    code, out, _ = cli("stats", "--by-key", "--json", "--name", "job.wait")
    assert code == 0 and json.loads(out) == [{"key": "acme", "due": 2, "oldest_wait": 60.0}]
    code, out, _ = cli("stats", "--by-key", "--name", "job.ok")
    assert code == 0 and "no due task has a fairness key" in out


async def test_operations_key_waits_validates_its_input() -> None:
    ops = Operations(MemoryDriver())
    bad: dict[str, Any]
    for bad in ({"names": "job"}, {"names": []}, {"limit": 0}, {"limit": 1001}, {"limit": True}):
        with pytest.raises(InvalidInput):
            await ops.key_waits(**bad)
    assert await ops.key_waits(limit=1000) == []


@pytest.mark.parametrize("args", [["--window", "0"], ["--window", "20000"], ["--name", "$bad"]])
def test_bad_stats_input_exits_2(store: MemoryDriver, args: list[str]) -> None:
    code, _, err = cli("stats", *args)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err


async def test_operations_stats_validates_its_input() -> None:
    ops = Operations(MemoryDriver())
    bad: dict[str, Any]
    for bad in (
        {"window": 0},
        {"window": timedelta(days=8)},
        {"window": float("nan")},
        {"window": True},
        {"names": "job"},
        {"names": []},
        {"names": ["a|b"]},
        {"statuses": ["done"]},
    ):
        with pytest.raises(InvalidInput):
            await ops.stats(**bad)
    stats = await ops.stats(window=120, statuses=["running"])
    assert stats.window_seconds == 120 and stats.counts == {"running": 0}


def test_stats_progress_names_the_phase_on_a_terminal_and_is_gone_after() -> None:
    """On a terminal, ``stats`` shows which read is running and for how long (transient: erased
    once the numbers are in); elsewhere (a pipe, ``--json``) it writes nothing."""
    clock = FakeClock()
    driver = MemoryDriver(clock)
    asyncio.run(_seed(driver, clock))
    ops = Operations(driver, clock=clock)
    shown = io.StringIO()
    console = Console(file=shown, force_terminal=True, width=120)
    stats = asyncio.run(stats_with_progress(ops, timedelta(minutes=5), None, console, True))
    assert stats.total == 6
    text = shown.getvalue()
    assert COUNT_STEP in text and "0:00:00" in text  # the phase and the elapsed time
    assert text.endswith("\x1b[2K"), "the line is erased at the end (transient)"

    hidden = io.StringIO()
    asyncio.run(
        stats_with_progress(ops, timedelta(minutes=5), None, Console(file=hidden, force_terminal=True), False)
    )
    assert hidden.getvalue() == ""
    code, _, err = cli_with(driver, clock, "stats")
    assert code == 0 and err == "", "CliRunner's stderr is no terminal: no progress line"


def cli_with(driver: MemoryDriver, clock: FakeClock, *args: str) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_ops, "operations_override", lambda: Operations(driver, clock=clock))
        return cli(*args)
