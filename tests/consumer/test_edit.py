"""Operations.edit (F26): the live option rules of Publisher.update_option, one definition."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mscheduler import (
    FakeClock,
    InvalidInput,
    OptionChange,
    Publisher,
    Task,
    TaskOption,
    TaskStatus,
    UnknownTask,
)
from mscheduler.domain.exceptions import TransitionRefused
from mscheduler.domain.retry import ExponentialRetry
from mscheduler.drivers.base import ClaimParams, FinishParams
from mscheduler.operations import Operations


async def test_edit_changes_a_pending_tasks_options_and_refuses_finished_ones(make_driver: Any) -> None:
    clock = FakeClock()
    driver = make_driver(clock)
    await driver.setup()
    publisher = Publisher(driver, clock=clock)
    ops = Operations(driver, clock=clock)
    await publisher.send(Task("t", "job", option=TaskOption(priority=1)))
    later = clock.now() + timedelta(minutes=5)
    policy = ExponentialRetry(base_delay=timedelta(seconds=1), max_retries=7)
    option = await ops.edit("t", OptionChange(priority=9, run_at=later, retry=policy))
    assert (option.priority, option.run_at, option.max_unexpected_retries) == (9, later, 7)
    info = await ops.get_task("t")
    assert info.option == option and info.claim_at == later and info.max_attempts == 8
    with pytest.raises(InvalidInput):
        await ops.edit("t", OptionChange(worker_timeout=timedelta(milliseconds=1)))  # < ping_interval
    assert (await ops.get_task("t")).option == option, "nothing changed on refusal"
    with pytest.raises(UnknownTask):
        await ops.edit("nope", OptionChange(priority=1))
    (claimed,) = await driver.claim(ClaimParams("w1", ["job"], later, ["a1"]))
    assert await driver.finish([FinishParams("t", "w1", claimed.attempt, later, "succeeded")]) == [True]
    assert (await ops.get_task("t")).status is TaskStatus.SUCCEEDED
    with pytest.raises(TransitionRefused, match="succeeded"):
        await ops.edit("t", OptionChange(priority=2))
