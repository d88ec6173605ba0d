"""``/api/v1/bulk`` (issue 20, item 3): one action on many tasks — on keys at once with an outcome
per key (done / refused with the rule / unknown), on a filter in the background page by page with
progress, stoppable; only admin tokens change anything; bad input starts nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from mscheduler import Operations, Task
from mscheduler.web import bulk as bulk_module
from tests.web.support import ADMIN, READ, CountingDriver, publisher, tick


async def _send(driver: CountingDriver, keys: list[str], name: str = "job") -> None:
    await publisher(driver).send_many([Task(k, name, None) for k in keys])
    tick(driver)


async def _until_done(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    for _ in range(2000):
        job = (await client.get(f"/api/v1/bulk/{job_id}", headers=READ)).json()
        if job["state"] != "running":
            return dict(job)
        await asyncio.sleep(0)
    raise AssertionError("the bulk action did not end")


async def test_an_action_on_keys_answers_an_outcome_per_key(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await _send(driver, ["a", "b", "c"])
    await Operations(driver, clock=driver.clock).cancel("b")
    response = await client.post(
        "/api/v1/bulk", json={"action": "cancel", "keys": ["a", "b", "nope"], "reason": "dup"}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["done"], body["refused"], body["unknown"]) == (1, 1, 1)
    assert body["results"][1] == {
        "key": "b",
        "outcome": "refused",
        "status": "cancelled",
        "rule": "only a pending or running task can be cancelled",
    }
    task = (await client.get("/api/v1/tasks/a", headers=ADMIN)).json()
    assert task["cancelled"]["by"] == "api:admin-1"


async def test_an_action_on_a_filter_runs_in_pages_with_progress(
    client: httpx.AsyncClient, driver: CountingDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _send(driver, [f"inv-{i:03}" for i in range(60)])
    await _send(driver, ["other-1"], name="other")
    body = {"action": "pause", "filter": {"name": "job", "status": "pending"}}
    started = await client.post("/api/v1/bulk", json=body, headers=ADMIN)
    assert started.status_code == 202, started.text
    job = started.json()
    assert started.headers["location"] == f"bulk/{job['id']}"
    assert (job["matched"], job["matched_capped"], job["by"]) == (60, False, "api:admin-1")
    assert job["filter"] == {"name": "job", "status": "pending"}
    done = await _until_done(client, job["id"])
    assert (done["state"], done["processed"], done["done"], done["refused"]) == ("done", 60, 60, 0)
    assert done["results_total"] == 60 and done["results"][0] == {
        "key": "inv-000",
        "outcome": "done",
        "status": None,
        "rule": None,
    }
    page = (await client.get(f"/api/v1/bulk/{job['id']}", params={"results_from": 58}, headers=READ)).json()
    assert [r["key"] for r in page["results"]] == ["inv-058", "inv-059"]
    listed = (await client.get("/api/v1/bulk", headers=READ)).json()
    assert [j["id"] for j in listed] == [job["id"]] and listed[0]["results"] == []
    tasks = (await client.get("/api/v1/tasks", params={"limit": 100}, headers=ADMIN)).json()["tasks"]
    assert {t["key"] for t in tasks if t["paused"]} == {f"inv-{i:03}" for i in range(60)}


async def test_a_running_action_stops_after_its_page(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await _send(driver, [f"k{i:04}" for i in range(450)])
    started = (
        await client.post("/api/v1/bulk", json={"action": "cancel", "filter": {}}, headers=ADMIN)
    ).json()
    stopped = await client.post(f"/api/v1/bulk/{started['id']}/stop", headers=ADMIN)
    assert stopped.status_code == 202
    job = await _until_done(client, started["id"])
    assert job["state"] == "stopped" and 0 < job["processed"] < 450
    counts = await Operations(driver, clock=driver.clock).count_by_status()
    assert counts["cancelled"] == job["done"] and counts["pending"] == 450 - job["done"]


async def test_bad_input_starts_nothing(client: httpx.AsyncClient, driver: CountingDriver) -> None:
    await _send(driver, ["a"])
    driver.calls.clear()
    for body in (
        {"action": "explode", "keys": ["a"]},
        {"action": "cancel"},
        {"action": "cancel", "keys": ["a"], "filter": {}},
        {"action": "cancel", "filter": {"status": {"$ne": ""}}},
        {"action": "cancel", "filter": {"status": "lost"}},
        {"action": "cancel", "filter": {"created_from": 0}},
        {"action": "cancel", "filter": {"created_from": "2030-01-01T00:00:00"}},  # no offset
        {"action": "cancel", "filter": {"$where": "1"}},
        {"action": "cancel", "keys": []},
    ):
        response = await client.post("/api/v1/bulk", json=body, headers=ADMIN)
        assert response.status_code == 422, (body, response.text)
    assert driver.calls["control_task"] == 0 and driver.calls["list_tasks"] == 0
    assert (
        await client.post("/api/v1/bulk", json={"action": "cancel", "keys": ["a"]}, headers=READ)
    ).status_code == 403
    assert (await client.get("/api/v1/bulk/0123456789abcdef", headers=READ)).status_code == 404
    assert (await client.get("/api/v1/bulk/nope", headers=READ)).status_code == 422  # not an id: bad input
    assert (await client.get("/api/v1/bulk", headers=READ)).json() == []


async def test_too_many_running_actions_are_a_429(
    client: httpx.AsyncClient, driver: CountingDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk_module, "RUNNING_MAX", 1)
    await _send(driver, [f"k{i:04}" for i in range(450)])
    first = (await client.post("/api/v1/bulk", json={"action": "pause", "filter": {}}, headers=ADMIN)).json()
    second = await client.post("/api/v1/bulk", json={"action": "pause", "filter": {}}, headers=ADMIN)
    assert second.status_code == 429 and "retry-after" in second.headers
    await _until_done(client, first["id"])
