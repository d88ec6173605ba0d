"""Plan, worker, stats and health endpoints over a MemoryDriver-backed Operations."""

from __future__ import annotations

import httpx

from mscheduler import Operations, Task, TaskOption
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import WorkerInfo
from tests.web.support import ADMIN, READ, CountingDriver, client_for, publisher

PLANS = "/api/v1/plans"
EVERY_HOUR = {"schedule": {"kind": "every", "interval": 3600, "start": "2030-01-01T00:00:00Z"}}


def _plan(plan_id: str, **extra: object) -> dict[str, object]:
    return {"plan_id": plan_id, "name": "report", "params": {"to": "ops"}, "timing": EVERY_HOUR, **extra}


async def test_plan_lifecycle(client: httpx.AsyncClient) -> None:
    created = await client.post(PLANS, json=_plan("nightly"), headers=ADMIN)
    assert created.status_code == 201, created.text
    assert created.json()["plan_id"] == "nightly" and created.json()["state"] == "active"
    assert (await client.post(PLANS, json=_plan("other", suspended=True), headers=ADMIN)).status_code == 201
    again = await client.post(PLANS, json=_plan("nightly"), headers=ADMIN)
    assert again.status_code == 422 and "exists already" in again.json()["detail"]

    listed = await client.get(PLANS, headers=READ)
    assert [p["plan_id"] for p in listed.json()] == ["nightly", "other"]
    only = await client.get(PLANS, params={"state": "suspended"}, headers=READ)
    assert [p["plan_id"] for p in only.json()] == ["other"]
    page = await client.get(PLANS, params={"limit": 1, "skip": 1}, headers=READ)
    assert [p["plan_id"] for p in page.json()] == ["other"]

    detail = await client.get(f"{PLANS}/nightly", headers=READ)
    assert detail.status_code == 200 and detail.json()["params"] == {"to": "ops"}

    suspended = await client.post(f"{PLANS}/nightly/suspend", headers=ADMIN)
    assert suspended.json()["state"] == "suspended"
    resumed = await client.post(f"{PLANS}/nightly/resume", headers=ADMIN)
    assert resumed.json()["state"] == "active"
    skipped = await client.post(f"{PLANS}/nightly/skip", params={"n": 3}, headers=ADMIN)
    assert skipped.status_code == 200 and skipped.json()["skip_next"] == 3
    edited = await client.patch(
        f"{PLANS}/nightly", json={"params": {"to": "dev"}, "max_consecutive_failures": 5}, headers=ADMIN
    )
    assert edited.status_code == 200, edited.text
    assert edited.json()["params"] == {"to": "dev"} and edited.json()["max_consecutive_failures"] == 5
    assert edited.json()["name"] == "report"  # left out: unchanged
    retimed = await client.patch(
        f"{PLANS}/nightly",
        json={"timing": {"schedule": {**EVERY_HOUR["schedule"], "interval": 60}}},
        headers=ADMIN,
    )
    assert retimed.status_code == 200, retimed.text
    assert retimed.json()["timing"]["schedule"]["interval"] == "PT1M"

    removed = await client.delete(f"{PLANS}/nightly", headers=ADMIN)
    assert removed.status_code == 204
    assert (await client.get(f"{PLANS}/nightly", headers=READ)).status_code == 404


async def test_plan_refusals(client: httpx.AsyncClient) -> None:
    for method, path in (
        ("GET", "/nope"),
        ("POST", "/nope/suspend"),
        ("POST", "/nope/resume"),
        ("POST", "/nope/skip"),
        ("DELETE", "/nope"),
    ):
        response = await client.request(method, f"{PLANS}{path}", headers=ADMIN)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"] == "not_found"
    assert (await client.patch(f"{PLANS}/nope", json={}, headers=ADMIN)).status_code == 404
    for body in (
        _plan("bad", timing={"schedule": {"kind": "weekly", "weekdays": [7], "local_time": "09:00"}}),
        _plan("bad", timing={"schedule": {"kind": "cron", "expression": "not cron"}}),
        _plan("bad", timing={**EVERY_HOUR, "tz": "Mars/Olympus"}),
        _plan("bad", option={"run_at": "2030-01-01T00:00:00Z"}),
        _plan("bad", name="bad name!"),
        _plan("bad", extra_field=1),
    ):
        response = await client.post(PLANS, json=body, headers=ADMIN)
        assert response.status_code == 422, body
        assert response.json()["error"] == "invalid_input"
    assert (await client.post(PLANS, json=_plan("p"), headers=ADMIN)).status_code == 201
    for edit in ({"plan_id": "q"}, {"suspended": True}, {"max_consecutive_failures": 0}):
        assert (await client.patch(f"{PLANS}/p", json=edit, headers=ADMIN)).status_code == 422, edit
    assert (await client.post(f"{PLANS}/p/skip", params={"n": -1}, headers=ADMIN)).status_code == 422
    assert (await client.get(PLANS, params={"state": "bogus"}, headers=READ)).status_code == 422


async def test_workers_list_and_stop(client: httpx.AsyncClient, driver: CountingDriver) -> None:
    now = driver.clock.now()
    await driver.register_worker(WorkerInfo("w-1", "host-1", 42, ("job",), 4, now, ("gpu",)))
    listed = await client.get("/api/v1/workers", headers=READ)
    assert listed.status_code == 200
    (worker,) = listed.json()
    assert worker["worker_id"] == "w-1" and worker["live"] is True and worker["names"] == ["job"]
    assert worker["groups"] == ["gpu"]
    stopped = await client.post("/api/v1/workers/w-1/stop", headers=ADMIN)
    assert stopped.status_code == 202 and stopped.json() == {"worker_id": "w-1", "stop_requested": True}
    assert (await client.get("/api/v1/workers", headers=READ)).json()[0]["stop_requested"] is True
    unknown = await client.post("/api/v1/workers/w-9/stop", headers=ADMIN)
    assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"


async def test_workers_are_listed_a_page_at_a_time(client: httpx.AsyncClient, driver: CountingDriver) -> None:
    """18.7: the registry grows by a worker id per start; the API pages it (``X-Next-Cursor``)."""
    now = driver.clock.now()
    for i in range(5):
        await driver.register_worker(WorkerInfo(f"w-{i}", "h", i, ("job",), 1, now))
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = await client.get("/api/v1/workers", params=params, headers=READ)
        assert page.status_code == 200
        seen += [w["worker_id"] for w in page.json()]
        cursor = page.headers.get("X-Next-Cursor")
        if cursor is None:
            break
    assert seen == [f"w-{i}" for i in range(5)]
    bad = await client.get("/api/v1/workers", params={"cursor": "not-a-cursor"}, headers=READ)
    assert bad.status_code == 422


async def test_stats_counts_by_status(client: httpx.AsyncClient, driver: CountingDriver) -> None:
    await publisher(driver).send_many([Task(f"t{i}", "job") for i in range(3)])
    await Operations(driver, clock=driver.clock).cancel("t0")
    response = await client.get("/api/v1/stats", headers=READ)
    assert response.status_code == 200
    body = response.json()
    assert body["counts"]["pending"] == 2 and body["counts"]["cancelled"] == 1 and body["total"] == 3
    assert body["details"]["window_seconds"] == 3600 and body["details"]["names"][0]["name"] == "job"
    hour = await client.get("/api/v1/stats", params={"window": 600}, headers=READ)
    assert hour.status_code == 200 and hour.json()["details"]["window_seconds"] == 600
    assert (await client.get("/api/v1/stats", params={"window": 1}, headers=READ)).status_code == 422


async def test_stats_by_fairness_key(client: httpx.AsyncClient, driver: CountingDriver) -> None:
    await publisher(driver).send_many(
        [Task(f"a{i}", "job", option=TaskOption(fair_key="acme")) for i in range(3)]
        + [Task("b0", "other", option=TaskOption(fair_key="beta")), Task("plain", "job")]
    )
    response = await client.get("/api/v1/stats/keys", headers=READ)
    assert response.status_code == 200, response.text
    assert [(k["key"], k["due"]) for k in response.json()["keys"]] == [("acme", 3), ("beta", 1)]
    named = await client.get("/api/v1/stats/keys", params={"names": "other", "limit": 5}, headers=READ)
    assert [k["key"] for k in named.json()["keys"]] == ["beta"]
    for bad in ({"limit": 0}, {"limit": 1001}, {"names": "a|b"}):
        assert (await client.get("/api/v1/stats/keys", params=bad, headers=READ)).status_code == 422
    assert (await client.get("/api/v1/stats/keys")).status_code == 401


async def test_health_needs_no_token_and_says_when_storage_fails(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/v1/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}

    class Down(CountingDriver):
        async def get_task(self, key: str) -> dict[str, object] | None:
            raise StorageError("no primary", transient=True)

    async with client_for(Operations(Down())) as down:
        response = await down.get("/api/v1/health")
        assert response.status_code == 503 and response.json() == {"status": "unavailable"}
        failing = await down.get("/api/v1/tasks/x", headers=READ)
        assert failing.status_code == 503 and failing.headers["retry-after"] == "1"
        assert failing.json() == {"error": "storage_unavailable", "detail": "storage unavailable; try again"}


async def test_a_storage_error_retrying_cannot_fix_is_a_500_without_details(
    client: httpx.AsyncClient,
) -> None:
    class Broken(CountingDriver):
        async def get_task(self, key: str) -> dict[str, object] | None:
            raise StorageError("get task failed (configuration): Unauthorized secret-detail", config=True)

    async with client_for(Operations(Broken())) as broken:
        response = await broken.get("/api/v1/tasks/x", headers=READ)
        assert response.status_code == 500
        assert response.json() == {"error": "internal", "detail": "the server failed; see its log"}
