"""Bad input at the edges (issue 17 D15): dates out of range, plans' params, unhandled names,
worker ids that read as a group's token. Each is refused with a clear error (``InvalidInput``,
HTTP 422) and changes nothing; none is a 500."""

from __future__ import annotations

import base64
import json
import logging
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from mscheduler import EverySchedule, InvalidInput, Operations, Plan, PlanTiming, Task, TaskOption
from mscheduler.drivers.base import ClaimParams, WakeupParams, WorkerInfo
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.services.events import Events
from tests.web.support import ADMIN, READ, CountingDriver, publisher

PLANS = "/api/v1/plans"
# in UTC, year 10000 and year 0: no datetime can hold them
LATE = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(-timedelta(hours=14)))
EARLY = datetime(1, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=14)))
EVERY_HOUR = {"kind": "every", "interval": 3600, "start": "2030-01-01T00:00:00Z"}


def _plan(plan_id: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"plan_id": plan_id, "name": "report", "timing": {"schedule": EVERY_HOUR}}
    return body | extra


def _cursor(when: str) -> str:
    raw = json.dumps({"v": 1, "o": "created", "t": when, "k": "x"}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("when", [LATE, EARLY], ids=["year-9999-at-minus-14", "year-1-at-plus-14"])
async def test_dates_out_of_range_are_refused_not_a_server_error(
    client: httpx.AsyncClient, operations: Operations, when: datetime
) -> None:
    operations.driver.record_events = True
    iso = when.isoformat()
    refused = [
        await client.get("/api/v1/tasks", params={"cursor": _cursor(iso)}, headers=READ),
        await client.post(
            PLANS, json=_plan("at", timing={"schedule": {"kind": "at", "at": iso}}), headers=ADMIN
        ),
        await client.post(
            PLANS, json=_plan("start", timing={"schedule": EVERY_HOUR, "start": iso}), headers=ADMIN
        ),
        await client.post(
            PLANS, json=_plan("end", timing={"schedule": EVERY_HOUR, "end": iso}), headers=ADMIN
        ),
        await client.post(
            PLANS,
            json=_plan("every", timing={"schedule": {**EVERY_HOUR, "start": iso}}),
            headers=ADMIN,
        ),
        await client.post(PLANS, json=_plan("opt", option={"run_at": iso}), headers=ADMIN),
        await client.get("/api/v1/events", params={"since": iso}, headers=READ),
        await client.post(
            "/api/v1/tasks", json={"key": "t", "name": "job", "option": {"run_at": iso}}, headers=ADMIN
        ),
        await client.post(
            "/api/v1/tasks", json={"key": "t", "name": "job", "option": {"deadline": iso}}, headers=ADMIN
        ),
    ]
    for response in refused:
        assert response.status_code == 422, (response.request.url, response.text)
        assert "range" in response.text or "cursor" in response.text, response.text
    assert await operations.list_plans() == [] and await operations.list_tasks() == []
    # in Python: InvalidInput, whatever carries the date
    for make in (
        lambda: TaskOption(run_at=when),
        lambda: TaskOption(deadline=when),
        lambda: Task("t", "job", {"when": when}),
        lambda: PlanTiming(schedule=EverySchedule(interval=timedelta(hours=1), start=when)),
        lambda: Events(operations.driver).subscribe(since=when),
    ):
        with pytest.raises(InvalidInput, match="range"):
            make()


async def test_a_plan_s_params_have_send_s_cap(client: httpx.AsyncClient, operations: Operations) -> None:
    """Every run carries the plan's params: the 512 KiB cap of ``send`` holds for them too."""
    big = {"blob": "x" * (600 * 1024)}
    timing = PlanTiming(
        schedule=EverySchedule(interval=timedelta(hours=1), start=datetime(2030, 1, 1, tzinfo=UTC))
    )
    with pytest.raises(InvalidInput, match="max_params_bytes"):
        await operations.add_plan(Plan(plan_id="big", name="report", params=big, timing=timing))
    response = await client.post(PLANS, json=_plan("big", params=big), headers=ADMIN)
    assert response.status_code == 422 and "max_params_bytes" in response.text
    assert await operations.list_plans() == []
    await operations.add_plan(Plan(plan_id="small", name="report", params={"n": 1}, timing=timing))
    with pytest.raises(InvalidInput, match="max_params_bytes"):
        await operations.edit_plan("small", params=big)
    assert (await operations.get_plan("small")).params == {"n": 1}  # nothing changed


async def test_a_plan_for_a_name_no_live_worker_handles_warns_as_send_does(
    driver: CountingDriver, operations: Operations, caplog: pytest.LogCaptureFixture
) -> None:
    timing = PlanTiming(
        schedule=EverySchedule(interval=timedelta(hours=1), start=datetime(2030, 1, 1, tzinfo=UTC))
    )
    now = driver.clock.now()
    await driver.register_worker(WorkerInfo("w1", "h", 1, ["report"], 1, now))
    with caplog.at_level(logging.WARNING):
        await operations.add_plan(Plan(plan_id="handled", name="report", timing=timing))
        await operations.add_plan(Plan(plan_id="orphan", name="nobody_runs_this", timing=timing))
        await publisher(driver).send(Task("t", "nobody_sends_this"))
    warned = [r.getMessage() for r in caplog.records if "no live worker handles" in r.getMessage()]
    assert warned == [
        "no live worker handles tasks named 'nobody_runs_this': they wait until a consumer that "
        "registers a handler for that name starts",
        "no live worker handles tasks named 'nobody_sends_this': they wait until a consumer that "
        "registers a handler for that name starts",
    ]


async def test_a_worker_id_starting_with_g_colon_is_refused_everywhere(
    client: httpx.AsyncClient, driver: CountingDriver, operations: Operations
) -> None:
    """``g:<group>`` is how a group's claimer token reads: a worker with such an id would claim the
    tasks aimed at that group (the Mongo driver did, the memory driver did not)."""
    await publisher(driver).send(Task("gpu-job", "job", None, option=TaskOption(specific_groups=("gpu",))))
    lease = await client.post(
        "/api/v1/executors/lease",
        json={"worker_id": "g:gpu", "names": ["job"]},
        headers=ADMIN,  # an admin token may use the executors' routes
    )
    assert lease.status_code == 422, lease.text
    with pytest.raises(InvalidInput, match="g:"):
        await RemoteExecutors(driver, clock=driver.clock).lease("g:gpu", ["job"])
    with pytest.raises(InvalidInput, match="g:"):
        await operations.request_worker_stop("g:gpu")
    with pytest.raises(InvalidInput, match="g:"):
        await operations.list_tasks(worker_id="g:gpu")
    with pytest.raises(InvalidInput, match="g:"):
        await Events(driver).list(worker_id="g:gpu")
    with pytest.raises(InvalidInput, match="g:"):  # no driver ever sees such a claim
        ClaimParams("g:gpu", ["job"], driver.clock.now(), ["a1"])
    with pytest.raises(InvalidInput, match="g:"):
        WakeupParams("g:gpu", ["job"], driver.clock.now())
    assert (await operations.get_task("gpu-job")).status.value == "pending"  # nobody claimed it


async def test_a_task_sent_over_http_with_run_at_after_its_deadline_is_refused(
    client: httpx.AsyncClient, operations: Operations
) -> None:
    """Issue 17 B7 through ``POST /api/v1/tasks``: 422 naming both fields, nothing written."""
    option = {"run_at": "2030-01-01T01:00:00Z", "deadline": "2030-01-01T00:00:00Z"}
    response = await client.post(
        "/api/v1/tasks", json={"key": "t", "name": "job", "option": option}, headers=ADMIN
    )
    assert response.status_code == 422 and "run_at" in response.text and "deadline" in response.text
    assert await operations.list_tasks() == []
