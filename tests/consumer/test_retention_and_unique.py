"""Retention as a consumer's side task, and ``unique_by="params"`` through the publisher."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mscheduler import Operations, Task, TaskStatus
from mscheduler.domain.exceptions import InvalidInput, TransitionRefused, UnknownTask
from mscheduler.services.retention import Retention
from tests.consumer.support import Harness


async def _work(params: Any) -> str:
    return "ok"


async def test_a_consumer_with_retention_removes_finished_tasks_past_their_period(harness: Harness) -> None:
    retention = Retention(succeeded=timedelta(minutes=5))
    w1 = harness.consumer("w1", {"work": _work}, retention=retention, retention_interval=60)
    await harness.start(w1)
    assert w1.retention_service is not None
    assert await harness.publisher.send(Task("t", "work", {}))
    await harness.discover()
    await harness.recorder.wait("finished", 1)
    info = await harness.get("t")
    assert info.status is TaskStatus.SUCCEEDED and info.finish_time is not None
    await harness.advance(240)  # four passes: not yet 5 minutes
    assert (await harness.get("t")).status is TaskStatus.SUCCEEDED
    await harness.advance(120)
    with pytest.raises(UnknownTask):
        await harness.get("t")
    assert w1.retention_service.removed == 1
    await w1.stop()


async def test_a_consumer_without_retention_runs_no_retention(harness: Harness) -> None:
    w1 = harness.consumer("w1", {"work": _work})
    await harness.start(w1)
    assert w1.retention_service is None and "retention" not in w1._side
    await w1.stop()


@pytest.mark.parametrize(
    "kwargs", [{"retention": "7d"}, {"retention_interval": 0}, {"max_attempt_entries": 0}]
)
async def test_consumer_maintenance_options_are_validated(harness: Harness, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        harness.consumer("w1", {"work": _work}, **kwargs)


@pytest.mark.parametrize("period", [timedelta(0), timedelta(days=4000), 60])
def test_retention_periods_are_validated(period: Any) -> None:
    with pytest.raises(InvalidInput):
        Retention(succeeded=period)


async def test_send_unique_by_params_is_refused_while_a_live_task_has_them(harness: Harness) -> None:
    publisher = harness.publisher
    assert await publisher.send(Task("a", "work", {"order": 7, "kind": "x"}, unique_by="params"))
    assert not await publisher.send(Task("b", "work", {"kind": "x", "order": 7}, unique_by="params"))
    assert await publisher.send_many(
        [
            Task("c", "work", {"order": 7, "kind": "x"}),  # not unique by params
            Task("d", "work", {"order": 8, "kind": "x"}, unique_by="params"),
            Task("e", "other", {"order": 7, "kind": "x"}, unique_by="params"),  # another name
        ]
    ) == [True, True, True]
    info = await publisher.get("a")
    assert info.unique_hash is not None and info.unique_hash.startswith("sha256:")
    assert (await publisher.get("c")).unique_hash is None
    ops = Operations(harness.driver, clock=harness.clock)
    await ops.cancel("a")
    assert await publisher.send(Task("b", "work", {"kind": "x", "order": 7}, unique_by="params"))
    with pytest.raises(TransitionRefused, match="same params"):
        await ops.restart("a")
