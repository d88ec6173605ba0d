"""Operator injection (``{"$gt": ""}``, ``$where``, ``status[$ne]``) in query parameters and JSON
bodies: a 422 naming the field, and nothing queried or written (the store counts its calls)."""

from __future__ import annotations

import httpx
import pytest

from mscheduler import Operations, Task
from tests.web.support import ADMIN, CountingDriver, publisher

GT = '{"$gt": ""}'

QUERIES = [
    {"status": GT},
    {"status": "$where"},
    {"name": GT},
    {"name": "$where"},
    {"key_prefix": GT},
    {"key_prefix": "$where"},
    {"worker_id": GT},
    {"worker_id": "$ne"},
    {"created_from": GT},
    {"created_to": "$where"},
    {"finished_from": GT},
    {"finished_from": "0.5"},
    {"finished_to": "$where"},
    {"finished_from": "2030-01-01T00:00:00"},  # no offset
    {"finished_from": "2030-01-02T00:00:00Z", "finished_to": "2030-01-01T00:00:00Z"},
    {"group": GT},
    {"group": "$where"},
    {"group": "gpu eu"},
    {"group": ""},
    {"group[$ne]": "x"},
    {"cursor": GT},
    {"limit": GT},
    {"status[$ne]": "x"},
    {"$where": "sleep(100)"},
    {"filter": GT},
]


@pytest.mark.parametrize("params", QUERIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
async def test_injection_in_task_list_filters_is_422_and_queries_nothing(
    client: httpx.AsyncClient, driver: CountingDriver, params: dict[str, str]
) -> None:
    response = await client.get("/api/v1/tasks", params=params, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"
    assert driver.calls["list_tasks"] == 0


async def test_a_repeated_filter_is_refused(client: httpx.AsyncClient, driver: CountingDriver) -> None:
    response = await client.get("/api/v1/tasks?status=pending&status=failed", headers=ADMIN)
    assert response.status_code == 422 and "more than once" in response.json()["detail"]
    assert driver.calls["list_tasks"] == 0


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("GET", "/api/v1/plans", {"params": {"state": GT}}),
        ("GET", "/api/v1/plans", {"params": {"$where": "1"}}),
        ("POST", "/api/v1/tasks/t/restart", {"params": {"force": GT}}),
        ("DELETE", "/api/v1/tasks/t", {"params": {"force": "$where"}}),
        ("POST", "/api/v1/tasks/t/cancel", {"json": {"reason": {"$gt": ""}}}),
        ("POST", "/api/v1/tasks/t/cancel", {"json": {"$where": "1"}}),
        ("PATCH", "/api/v1/tasks/t/option", {"json": {"priority": {"$gt": 0}}}),
        ("PATCH", "/api/v1/tasks/t/option", {"json": {"$set": {"option.priority": 1}}}),
        ("PATCH", "/api/v1/tasks/t/option", {"json": {"specific_worker_ids": {"$ne": None}}}),
        ("POST", "/api/v1/plans/p/skip", {"params": {"n": GT}}),
        ("PATCH", "/api/v1/plans/p", {"json": {"params": {"$where": "1"}}}),
        ("PATCH", "/api/v1/plans/p", {"json": {"name": {"$gt": ""}}}),
        ("PATCH", "/api/v1/plans/p", {"json": {"$rename": {"a": "b"}}}),
    ],
)
async def test_injection_in_controls_is_422_and_changes_nothing(
    client: httpx.AsyncClient,
    driver: CountingDriver,
    operations: Operations,
    method: str,
    path: str,
    kwargs: dict[str, object],
) -> None:
    await publisher(driver).send(Task("t", "job"))
    assert (
        await client.post(
            "/api/v1/plans",
            json={
                "plan_id": "p",
                "name": "job",
                "timing": {"schedule": {"kind": "every", "interval": 60, "start": "2030-01-01T00:00:00Z"}},
            },
            headers=ADMIN,
        )
    ).status_code == 201
    task_before = await operations.get_task("t")
    plan_before = await operations.get_plan("p")
    driver.calls.clear()
    response = await client.request(method, path, headers=ADMIN, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"
    assert sum(driver.calls.values()) == 0, driver.calls
    assert await operations.get_task("t") == task_before
    assert await operations.get_plan("p") == plan_before


@pytest.mark.parametrize(
    "body",
    [
        {"plan_id": "x", "name": "job", "params": {"$where": "1"}, "timing": {"schedule": {"kind": "at"}}},
        {"plan_id": {"$gt": ""}, "name": "job", "timing": {"schedule": {"kind": "at"}}},
        {
            "plan_id": "$where",
            "name": "job",
            "timing": {"schedule": {"kind": "at", "at": "2030-01-01T00:00:00Z"}},
        },
        {
            "plan_id": "x",
            "name": "job",
            "params": {"nested": [{"$gt": ""}]},
            "timing": {"schedule": {"kind": "at", "at": "2030-01-01T00:00:00Z"}},
        },
        {
            "plan_id": "x",
            "name": "job",
            "timing": {"schedule": {"kind": "at", "at": "2030-01-01T00:00:00Z"}, "$where": "1"},
        },
    ],
)
async def test_injection_in_a_new_plan_is_422_and_writes_nothing(
    client: httpx.AsyncClient, driver: CountingDriver, body: dict[str, object]
) -> None:
    response = await client.post("/api/v1/plans", json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert driver.calls["insert_plan"] == 0
    assert (await client.get("/api/v1/plans", headers=ADMIN)).json() == []
