"""``mscheduler maintenance``: the expiry, planner and retention passes without a consumer, once
(``--once``) or in a loop until stopped; bad arguments refused with exit 2, nothing run."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest

from mscheduler import FakeClock, MemoryDriver, Operations
from mscheduler.cli import common as cli_ops
from mscheduler.cli import maintenance as cli_maintenance
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.services.expiry import ExpiryService
from mscheduler.services.retention import Retention
from tests.acceptance.support import cli
from tests.conformance.support import Store

DAY = 86_400


async def _seed(store: Store, ops: Operations) -> None:
    """One of each thing a pass acts on: a task finished 8 days ago (retention 7 days), a lease
    that ran out, a task past its deadline, a plan with an occurrence due."""
    await store.add("old")
    claimed = await store.claim_one("w")
    assert claimed is not None and await store.done(claimed, "w")
    store.advance(8 * DAY)
    await store.add("lease", deadline=None)
    assert await store.claim_one("w", lease=timedelta(seconds=30)) is not None
    await store.add("late", name="other", deadline=store.at(10))
    start = store.now + timedelta(seconds=5)
    plan = Plan(
        plan_id="p",
        name="job",
        timing=PlanTiming(schedule=EverySchedule(interval=timedelta(hours=1), start=start)),
    )
    await ops.add_plan(plan)
    store.advance(60)  # the lease ran out, the deadline passed, the plan's first occurrence is due


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Store, Operations]]:
    clock = FakeClock()
    store = Store(MemoryDriver(clock), clock)
    ops = Operations(store.driver, clock=clock)
    asyncio.run(_seed(store, ops))
    monkeypatch.setattr(cli_ops, "operations_override", lambda: ops)
    # as in a fresh process: no logging set up by an earlier command of this test session
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)
    yield store, ops


def status_of(store: Store, key: str) -> str | None:
    doc = asyncio.run(store.driver.get_task(key))
    return None if doc is None else str(doc["state"]["status"])


def test_once_runs_each_pass_and_says_what_it_did(world: tuple[Store, Operations]) -> None:
    store, ops = world
    code, out, err = cli("maintenance", "--once", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"leases_lost": 1, "deadlines_expired": 1, "occurrences": 1, "removed": 1}
    assert status_of(store, "old") is None  # removed: succeeded 8 days ago, kept 7
    assert status_of(store, "lease") == "pending"  # lost, claimable again (budget left)
    assert status_of(store, "late") == "expired"
    plan = asyncio.run(ops.get_plan("p"))
    assert plan.runs_made == 1 and status_of(store, plan.last_run_key or "") == "pending"

    code, out, _ = cli("maintenance", "--once")  # nothing left to do: a line of zeros
    assert (code, out) == (0, "leases lost: 0, deadlines expired: 0, occurrences: 0, removed: 0\n")


def test_once_with_passes_switched_off_and_longer_periods(world: tuple[Store, Operations]) -> None:
    store, _ = world
    code, out, _ = cli(
        "maintenance", "--once", "--json", "--no-planner", "--no-expiry", "--keep-succeeded", "9d"
    )
    assert code == 0 and json.loads(out) == {"removed": 0}
    assert status_of(store, "old") == "succeeded" and status_of(store, "late") == "pending"
    code, out, _ = cli("maintenance", "--once", "--json", "--no-retention", "--no-planner")
    assert code == 0 and json.loads(out) == {"leases_lost": 1, "deadlines_expired": 1}
    assert status_of(store, "old") == "succeeded"
    code, out, _ = cli(
        "maintenance", "--once", "--json", "--no-expiry", "--no-planner", "--keep-succeeded", "never"
    )
    assert code == 0 and json.loads(out) == {"removed": 0}
    assert status_of(store, "old") == "succeeded"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--keep-failed", "3x"],
            "error: --keep-failed: a period such as 7d, 36h, 90m or 3600s, or 'never' (got '3x')",
        ),
        (["--keep-expired", '{"$gt": ""}'], "error: --keep-expired: a period such as"),
        (["--keep-succeeded", "0s"], "error: retention succeeded: a timedelta from 1 second"),
        (
            ["--no-expiry", "--no-planner", "--no-retention"],
            "error: nothing to run: every pass is switched off",
        ),
    ],
)
def test_bad_arguments_are_refused_and_nothing_runs(
    world: tuple[Store, Operations], args: list[str], message: str
) -> None:
    store, _ = world
    code, out, err = cli("maintenance", "--once", *args)
    assert code == 2 and out == "" and err.startswith(message), err
    assert err.count("\n") == 1, "one line, no traceback"
    assert status_of(store, "old") == "succeeded" and status_of(store, "late") == "pending"


def test_the_loop_passes_on_the_clock_until_stopped() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        store = Store(MemoryDriver(clock), clock)
        ops = Operations(store.driver, clock=clock)
        found = cli_maintenance.services(ops, expiry=True, planner=True, retention=Retention(), interval=5)
        assert [s.what for s in found] == ["expiry", "planner", "retention"]
        assert [s.interval for s in found] == [5, 5, 60.0]  # retention at most once a minute
        runner = asyncio.create_task(cli_maintenance.run_until_stopped(ops, found))
        for _ in range(50):
            await asyncio.sleep(0)
        assert [s.passes for s in found] == [1, 1, 1]
        await store.add("late", deadline=store.at(7))
        for _ in range(2):
            store.advance(5)
            for _ in range(50):
                await asyncio.sleep(0)
        expiry = found[0]
        assert isinstance(expiry, ExpiryService)
        assert expiry.passes == 3 and expiry.deadlines_expired == 1
        assert (await store.driver.get_task("late") or {})["state"]["status"] == "expired"
        for service in found:
            service.stop()
        done = await asyncio.wait_for(runner, 1)
        assert done == {"leases_lost": 0, "deadlines_expired": 1, "occurrences": 0, "removed": 0}

    asyncio.run(scenario())


def test_period_syntax() -> None:
    parse = cli_maintenance.parse_period
    assert parse("7d", "x") == timedelta(days=7) and parse("36h", "x") == timedelta(hours=36)
    assert parse("90m", "x") == timedelta(minutes=90) and parse("3600", "x") == timedelta(hours=1)
    assert parse(" Never ", "x") is None
    for shown in ("7d", "12h", "90m", "61s", "never"):
        assert cli_maintenance.shown_period(parse(shown, "x")) == shown
