"""An expired task restarts, with a new deadline or without one; and a task whose stored option
breaks today's rules for new options (written by an earlier build, or by hand) is still listed,
shown, cancelled, restarted and removed — in process, over the REST API and in the CLI.

On 4dad86a reading such an option back raised ``invalid stored TaskOption: ... run_at (...) is
after deadline (...)``: the rule meant for new options ran again while a stored one was read
(the model's own ``__init__`` validates it, without the "stored" context).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, InvalidInput, Operations, RemoteOperations, Task, TaskOption
from mscheduler.domain.model import TaskStatus
from mscheduler.drivers.base import Driver, ExpireParams, InsertParams, NewTask
from mscheduler.web import ApiTokens, create_app
from tests.conftest import DriverFactory

TOKEN = "restart-admin-token-0123456789abcdef"


async def store_of(make_driver: DriverFactory, clock: FakeClock) -> tuple[Driver, Operations]:
    driver = make_driver(clock)
    await driver.setup()
    return driver, Operations(driver, clock=clock)


async def test_an_expired_task_restarts_without_its_passed_deadline_or_with_a_new_one(
    make_driver: DriverFactory, fake_clock: FakeClock
) -> None:
    driver, ops = await store_of(make_driver, fake_clock)
    start = fake_clock.now()
    option = TaskOption(run_at=start + timedelta(seconds=5), deadline=start + timedelta(seconds=10))
    for key in ("a", "b"):
        await ops.send(Task(key, "nobody", option=option), allow_unknown=True)
    fake_clock.advance(timedelta(seconds=20))
    assert await driver.expire_deadlines(ExpireParams(fake_clock.now())) == 2
    restarted = await ops.restart("a")
    assert (restarted.status, restarted.option.deadline) == (TaskStatus.PENDING, None)

    with pytest.raises(InvalidInput, match="has passed"):
        await ops.restart("b", deadline=fake_clock.now() - timedelta(seconds=1))
    with pytest.raises(InvalidInput, match="timezone-aware"):
        await ops.restart("b", deadline=datetime(2031, 1, 1))
    assert (await ops.get_task("b")).status is TaskStatus.EXPIRED, "refused input changed nothing"
    later = fake_clock.now() + timedelta(hours=1)
    restarted = await ops.restart("b", deadline=later)
    assert (restarted.status, restarted.option.deadline) == (TaskStatus.PENDING, later)
    fake_clock.advance(timedelta(hours=2))
    assert await driver.expire_deadlines(ExpireParams(fake_clock.now())) == 1, "b by its new deadline"


async def test_a_restart_deadline_before_the_tasks_run_at_is_refused(
    make_driver: DriverFactory, fake_clock: FakeClock
) -> None:
    _, ops = await store_of(make_driver, fake_clock)
    later = fake_clock.now() + timedelta(hours=2)
    await ops.send(Task("t", "nobody", option=TaskOption(run_at=later)), allow_unknown=True)
    await ops.cancel("t")
    with pytest.raises(InvalidInput, match="before the task's run_at"):
        await ops.restart("t", deadline=later - timedelta(hours=1))


async def stored_against_todays_rules(driver: Driver, clock: FakeClock, key: str) -> None:
    """A task whose stored option an earlier build could write: run_at after the deadline, a
    worker timeout no longer than its ping interval."""
    now = clock.now()
    option = TaskOption(deadline=now + timedelta(seconds=10)).to_storage(now)
    option |= {"run_at": now + timedelta(seconds=20), "ping_interval_ms": 30_000, "worker_timeout_ms": 30_000}
    await driver.insert_tasks(InsertParams([NewTask(key, "job", None, option)], now))


async def test_a_stored_option_breaking_todays_rules_stays_readable_and_steerable(
    make_driver: DriverFactory, fake_clock: FakeClock
) -> None:
    driver, ops = await store_of(make_driver, fake_clock)
    for key in ("old-1", "old-2", "old-3"):
        await stored_against_todays_rules(driver, fake_clock, key)
    info = await ops.get_task("old-1")
    assert info.option.run_at is not None and info.option.deadline is not None
    assert info.option.run_at > info.option.deadline
    assert sorted(t.key for t in await ops.list_tasks()) == ["old-1", "old-2", "old-3"]
    assert (await ops.cancel("old-1")).status is TaskStatus.CANCELLED
    fake_clock.advance(timedelta(seconds=30))
    await driver.expire_deadlines(ExpireParams(fake_clock.now()))
    assert (await ops.restart("old-2")).status is TaskStatus.PENDING
    await ops.remove("old-3")

    app = create_app(operations=ops, tokens=ApiTokens(admin=[TOKEN]))
    async with RemoteOperations("http://test", TOKEN, transport=httpx.ASGITransport(app=app)) as remote:
        assert (await remote.get_task("old-1")).status is TaskStatus.CANCELLED
        assert sorted(t.key for t in await remote.list_tasks()) == ["old-1", "old-2"]
        await remote.cancel("old-2")
        again = await remote.restart("old-2", deadline=fake_clock.now() + timedelta(hours=1))
        assert again.status is TaskStatus.PENDING


async def test_the_cli_restarts_with_a_new_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from mscheduler import MemoryDriver
    from mscheduler.cli import common as cli_ops
    from tests.acceptance.support import cli

    clock = FakeClock()
    driver = MemoryDriver(clock=clock)
    ops = Operations(driver, clock=clock)
    deadline = clock.now() + timedelta(seconds=5)

    async def seed() -> Any:
        await ops.send(Task("t", "nobody", option=TaskOption(deadline=deadline)), allow_unknown=True)
        clock.advance(timedelta(seconds=10))
        await driver.expire_deadlines(ExpireParams(clock.now()))

    await seed()
    monkeypatch.setattr(cli_ops, "operations_override", lambda: ops)
    code, out, err = await asyncio.to_thread(
        cli, "tasks", "restart", "t", "--deadline", "2030-06-01T00:00:00Z"
    )
    assert (code, err) == (0, ""), out
    info = await ops.get_task("t")
    assert info.status is TaskStatus.PENDING and info.option.deadline is not None
    assert info.option.deadline.isoformat() == "2030-06-01T00:00:00+00:00"
    code, _, err = await asyncio.to_thread(cli, "tasks", "restart", "t", "--deadline", "tomorrow")
    assert code == 2 and "--deadline" in err
