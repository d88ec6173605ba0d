"""The REST API over MongoDriver on mongomock: the Mongo listings (filters, named indexes,
cursor paging), detail, a control and plans, end to end."""

from __future__ import annotations

from datetime import timedelta

from mscheduler import FakeClock, MongoDriver, Operations, Publisher, Task
from mscheduler.drivers.base import ClaimParams
from mscheduler.testing import mongomock_database
from tests.web.support import ADMIN, READ, client_for


async def test_the_api_over_mongo_on_mongomock() -> None:
    clock = FakeClock()
    driver = MongoDriver(mongomock_database())
    await driver.setup()
    async with client_for(Operations(driver, clock=clock)) as client:
        # the plan first: add_plan runs setup() again, and mongomock (unlike a server) checks a
        # partial unique index against every existing task when it is created a second time
        plan = {
            "plan_id": "p",
            "name": "job",
            "timing": {"schedule": {"kind": "every", "interval": 60, "start": "2030-01-01T00:00:00Z"}},
        }
        assert (await client.post("/api/v1/plans", json=plan, headers=ADMIN)).status_code == 201

        publisher = Publisher(driver, clock=clock)
        for batch in range(3):
            await publisher.send_many([Task(f"job-{batch}-{i:02}", "job") for i in range(20)])
            clock.advance(timedelta(milliseconds=1))
        await publisher.send(Task("mail-1", "mail"))
        await driver.claim(ClaimParams("w1", ["mail"], clock.now(), ["a1"]))

        seen: list[str] = []
        params: dict[str, str | int] = {"limit": 7, "name": "job"}
        while True:
            page = (await client.get("/api/v1/tasks", params=params, headers=READ)).json()
            seen += [t["key"] for t in page["tasks"]]
            if page["next_cursor"] is None:
                break
            params["cursor"] = page["next_cursor"]
        assert seen == [f"job-{b}-{i:02}" for b in range(3) for i in range(20)]

        prefixed = await client.get("/api/v1/tasks", params={"key_prefix": "job-1-1"}, headers=READ)
        assert [t["key"] for t in prefixed.json()["tasks"]] == [f"job-1-1{i}" for i in range(10)]
        mine = await client.get("/api/v1/tasks", params={"worker_id": "w1"}, headers=READ)
        assert [t["key"] for t in mine.json()["tasks"]] == ["mail-1"]
        created = (await client.get("/api/v1/tasks/job-2-00", headers=READ)).json()["create_time"]
        later = await client.get(
            "/api/v1/tasks", params={"created_from": created, "limit": 100}, headers=READ
        )
        assert len(later.json()["tasks"]) == 21

        cancelled = await client.post("/api/v1/tasks/mail-1/cancel", json={"reason": "x"}, headers=ADMIN)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        stats = (await client.get("/api/v1/stats", headers=READ)).json()
        assert stats["counts"]["cancelled"] == 1 and stats["total"] == 61

        assert (await client.post("/api/v1/plans/p/suspend", headers=ADMIN)).json()["state"] == "suspended"
        assert (await client.get("/api/v1/health")).json() == {"status": "ok"}


async def test_limits_routes_and_the_executor_refusal_on_mongomock() -> None:
    clock = FakeClock()
    driver = MongoDriver(mongomock_database())
    await driver.setup()
    async with client_for(Operations(driver, clock=clock)) as client:
        body = {"names": ["fetch", "push"], "max_running": 2, "rate": "5/s"}
        put = await client.put("/api/v1/limits/partner", json=body, headers=ADMIN)
        assert put.status_code == 200, put.text
        assert (put.json()["names"], put.json()["rate_n"]) == (["fetch", "push"], 5)
        taken = await client.put(
            "/api/v1/limits/other", json={"names": ["push"], "max_running": 1}, headers=ADMIN
        )
        assert taken.status_code == 422
        assert [d["key"] for d in (await client.get("/api/v1/limits", headers=READ)).json()] == ["partner"]

        await Publisher(driver, clock=clock).send_many([Task("f1", "fetch"), Task("m1", "mail")])
        lease = {"worker_id": "ex-1", "names": ["fetch"]}
        refused = await client.post("/api/v1/executors/lease", json=lease, headers=ADMIN)
        assert refused.status_code == 409 and refused.json()["error"] == "limited_name"
        lease["names"] = ["mail"]
        leased = await client.post("/api/v1/executors/lease", json=lease, headers=ADMIN)
        assert [t["key"] for t in leased.json()["tasks"]] == ["m1"]

        assert (await client.delete("/api/v1/limits/partner", headers=ADMIN)).status_code == 204
        assert (await client.get("/api/v1/limits/partner", headers=READ)).status_code == 404
