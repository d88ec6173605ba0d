"""The plain functions behind the CLI, in process: the demo on the Mongo driver, check, the loader."""

from __future__ import annotations

import dataclasses

import pytest

from mscheduler import Consumer, MemoryDriver
from mscheduler.cli.check import EXPECTED_INDEXES, check_server
from mscheduler.cli.common import CliError, import_target, redact
from mscheduler.cli.demo import DemoConfig, check_report, run_demo, run_demo_on_database
from mscheduler.cli.worker import resolve_consumers
from mscheduler.domain.model import AttemptStatus
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database


async def test_demo_on_the_mongo_driver_exercises_every_path() -> None:
    database = mongomock_database()
    report, prefix = await run_demo_on_database(database, config=DemoConfig(quick=8))
    failing = [(c.name, c.detail) for c in report.checks if not c.ok]
    assert not failing, failing
    assert report.status_counts == {"succeeded": 20, "failed": 1}  # 8 quick, 6 flaky, 4 aimed, long, fan-out
    assert prefix.startswith("demo_")
    assert await database.list_collection_names() == []  # dropped afterwards


async def test_report_checks_catch_a_missing_retry_and_a_stray_worker() -> None:
    config = DemoConfig(quick=2, flaky=2, targeted=1)
    report = await run_demo(MemoryDriver(), config=config)
    assert report.ok, report.checks
    flaky = next(t for t in report.tasks if t.key == "flaky-000")
    targeted = next(t for t in report.tasks if t.key == "targeted-000")
    # Pretend the flaky task never failed and the targeted one ran on another worker.
    flaky.worker_states = [w for w in flaky.worker_states if w.status is AttemptStatus.SUCCEEDED]
    targeted.worker_states = [
        w.model_copy(update={"worker_id": "demo-worker-1"}) for w in targeted.worker_states
    ]
    checks = {c.name: c for c in check_report(report, config)}
    assert not checks["retries"].ok
    assert not checks["targeting"].ok
    assert checks["end states"].ok


def test_demo_config_refuses_a_long_task_too_short_to_show_pings() -> None:
    with pytest.raises(ValueError, match="outlast"):
        DemoConfig(long_duration=0.5)
    with pytest.raises(ValueError, match="at least 3 workers"):
        dataclasses.replace(DemoConfig(), workers=2)


async def test_check_reports_and_creates_missing_indexes() -> None:
    database = mongomock_database()
    before = {line.name: line for line in await check_server(database, prefix="x_")}
    assert before["indexes"].level == "warn"
    assert "missing" in before["indexes"].detail
    assert before["change streams"].level == "warn"  # mongomock cannot watch: polling
    created = {line.name: line for line in await check_server(database, prefix="x_", create_indexes=True)}
    assert created["indexes"].level == "ok", created["indexes"]
    after = {line.name: line for line in await check_server(database, prefix="x_")}
    assert after["indexes"].level == "ok"
    assert f"all {len(EXPECTED_INDEXES)} present" in after["indexes"].detail


async def test_expected_indexes_match_what_the_driver_creates() -> None:
    driver = MongoDriver(mongomock_database(), create_indexes=True)
    await driver.setup()
    assert set(await driver.index_names()) - {"_id_"} == set(EXPECTED_INDEXES)


async def test_loader_accepts_consumers_lists_and_factories() -> None:
    consumers = await resolve_consumers(import_target("tests.acceptance.worker_app:sync_factory"), "x")
    assert [c.worker_id for c in consumers] == ["acc-sync"]
    made = await resolve_consumers(import_target("tests.acceptance.worker_app:factory"), "x")
    assert [c.worker_id for c in made] == ["acc-worker-1", "acc-worker-2"]
    assert await resolve_consumers(made, "x") == made
    twins = [Consumer(MemoryDriver(), worker_id="same"), Consumer(MemoryDriver(), worker_id="same")]
    with pytest.raises(CliError, match="same worker_id"):
        await resolve_consumers(twins, "x")
    with pytest.raises(CliError, match="is of type type"):
        await resolve_consumers(Consumer, "x")
    with pytest.raises(CliError, match="returned of type NoneType"):
        await resolve_consumers(lambda: None, "x")


def test_redact_hides_passwords_only() -> None:
    assert redact("mongodb://u:p@h:1/db") == "mongodb://u:***@h:1/db"
    assert redact("mongodb+srv://u:p@cluster.example/") == "mongodb+srv://u:***@cluster.example/"
    assert redact("mongodb://h:1/") == "mongodb://h:1/"
