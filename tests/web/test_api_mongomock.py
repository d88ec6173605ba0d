"""The REST API over MongoDriver on mongomock: the Mongo listings (filters, named indexes,
cursor paging), detail, a control and plans, end to end."""

from __future__ import annotations

from datetime import timedelta

from mscheduler import FakeClock, MongoDriver, Operations, Publisher, Task
from mscheduler.drivers.base import ClaimParams
from mscheduler.testing.mongomock import mongomock_database
from tests.web.support import ADMIN, READ, client_for


async def test_the_api_over_mongo_on_mongomock() -> None:
    clock = FakeClock()
    driver = MongoDriver(mongomock_database(), create_indexes=True)
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


async def test_limits_routes_and_executors_taking_slots_on_mongomock() -> None:
    """The limit routes, and an executor leasing limited names through the Mongo driver's slot
    pipelines: slots stamped with its id and attempts, extended by its ping to the lease's
    expiry, released after its reports."""
    clock = FakeClock()
    driver = MongoDriver(mongomock_database(), create_indexes=True)
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

        tasks = [Task(f"f{n}", "fetch") for n in range(3)] + [Task("m1", "mail")]
        await Publisher(driver, clock=clock).send_many(tasks)
        lease = {"worker_id": "ex-1", "names": ["fetch", "mail"], "max_tasks": 4}
        leased = (await client.post("/api/v1/executors/lease", json=lease, headers=ADMIN)).json()["tasks"]
        fetched = [t for t in leased if t["name"] == "fetch"]
        assert len(fetched) == 2 and [t["key"] for t in leased if t["name"] == "mail"] == ["m1"]
        limit = (await client.get("/api/v1/limits/partner", headers=ADMIN)).json()  # READ: tokens blanked
        assert limit["running"] == 2 and limit["recent_starts"] == 2
        assert sorted((h["worker_id"], h["attempt"]) for h in limit["holders"]) == sorted(
            ("ex-1", t["attempt"]) for t in fetched
        )

        clock.advance(10)
        ping = {"worker_id": "ex-1", "tasks": [{"key": t["key"], "attempt": t["attempt"]} for t in fetched]}
        answers = (await client.post("/api/v1/executors/ping", json=ping, headers=ADMIN)).json()["tasks"]
        assert [a["state"] for a in answers] == ["alive", "alive"]
        holders = (await client.get("/api/v1/limits/partner", headers=READ)).json()["holders"]
        assert {h["expire_time"] for h in holders} == {a["lease_expires"] for a in answers}

        for task in fetched:
            done = {"worker_id": "ex-1", "key": task["key"], "attempt": task["attempt"]}
            reported = await client.post(
                "/api/v1/executors/report", json=done | {"outcome": "succeeded"}, headers=ADMIN
            )
            assert reported.status_code == 200
        for _ in range(100):  # the releases ride the finisher's next turn
            if (await client.get("/api/v1/limits/partner", headers=READ)).json()["running"] == 0:
                break
        assert (await client.get("/api/v1/limits/partner", headers=READ)).json()["running"] == 0
        again = (await client.post("/api/v1/executors/lease", json=lease, headers=ADMIN)).json()["tasks"]
        rest = [t.key for t in tasks[:3] if t.key not in {f["key"] for f in fetched}]
        assert [t["key"] for t in again] == rest  # the third, now that slots are free

        assert (await client.delete("/api/v1/limits/partner", headers=ADMIN)).status_code == 204
        assert (await client.get("/api/v1/limits/partner", headers=READ)).status_code == 404
