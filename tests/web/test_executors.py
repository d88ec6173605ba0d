"""Remote executors over HTTP (SPEC F30): lease, ping, report through the API, with the Python
consumer's lease, fencing, retry and targeting rules; long polls; the executor role."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, MemoryDriver, Operations, OptionChange, Task, TaskOption
from mscheduler.domain.retry import FixedRetry
from mscheduler.drivers.base import EventQuery
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web import ApiTokens, create_app
from tests.helpers import wait_until
from tests.web.support import ADMIN, ADMIN_TOKEN, READ, READ_TOKEN, CountingDriver, publisher, tick

EXECUTOR_TOKEN = "executor-token-0123456789abcdef"
EXEC = {"Authorization": f"Bearer {EXECUTOR_TOKEN}"}
TOKENS = ApiTokens(admin=[ADMIN_TOKEN], read=[READ_TOKEN], executor=[EXECUTOR_TOKEN])
LEASE, PING, REPORT = "/api/v1/executors/lease", "/api/v1/executors/ping", "/api/v1/executors/report"


@pytest.fixture
async def http(operations: Operations) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(operations=operations, tokens=TOKENS)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        yield client


async def settle(rounds: int = 200) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def lease(http: httpx.AsyncClient, worker_id: str = "ex-1", **more: Any) -> dict[str, Any]:
    body = {"worker_id": worker_id, "names": ["job"]} | more
    response = await http.post(LEASE, json=body, headers=EXEC)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def report(
    http: httpx.AsyncClient, task: dict[str, Any], worker_id: str = "ex-1", **more: Any
) -> httpx.Response:
    body = {"worker_id": worker_id, "key": task["key"], "attempt": task["attempt"]} | more
    return await http.post(REPORT, json=body, headers=EXEC)


async def task_of(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    response = await http.get(f"/api/v1/tasks/{key}", headers=ADMIN)
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    return doc


async def test_lease_ping_checkpoint_and_report_success(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await publisher(driver).send(
        Task("t1", "job", {"n": 1}, option=TaskOption(ping_interval=timedelta(seconds=5)))
    )
    got = await lease(http, max_tasks=2, host="box-1", pid=42)
    assert got["stop_requested"] is False
    [task] = got["tasks"]
    assert (task["key"], task["name"], task["params"], task["attempt_no"]) == ("t1", "job", {"n": 1}, 1)
    assert (task["ping_interval_seconds"], task["lease_seconds"], task["checkpoint"]) == (5.0, 30.0, None)
    workers = (await http.get("/api/v1/workers", headers=ADMIN)).json()
    assert [(w["worker_id"], w["host"], w["pid"], w["names"]) for w in workers] == [
        ("ex-1", "box-1", 42, ["job"])
    ]

    tick(driver, 10_000)
    ping = await http.post(
        PING,
        json={
            "worker_id": "ex-1",
            "tasks": [
                {
                    "key": "t1",
                    "attempt": task["attempt"],
                    "checkpoint": {"done": 3},
                    "progress": {"fraction": 0.5, "message": "half"},
                }
            ],
        },
        headers=EXEC,
    )
    assert ping.status_code == 200, ping.text
    [alive] = ping.json()["tasks"]
    assert (alive["state"], alive["recorded"], alive["ping_interval_seconds"]) == ("alive", True, 5.0)
    stored = await driver.get_task("t1")
    assert stored is not None
    assert stored["state"]["checkpoint"]["data"] == {"done": 3}
    assert stored["state"]["worker_states"][0]["ping_expire_time"] == driver.clock.now() + timedelta(
        seconds=30
    )

    done = await report(http, task, outcome="succeeded", result={"ok": True})
    assert done.status_code == 200, done.text
    assert (done.json()["status"], done.json()["duplicate"]) == ("succeeded", False)
    info = await task_of(http, "t1")
    assert info["status"] == "succeeded"
    assert info["worker_states"][0]["result"] == {"ok": True}
    # the same report again (a lost reply): recorded once, answered as a duplicate
    tick(driver)
    again = await report(http, task, outcome="succeeded", result={"ok": True})
    assert (again.status_code, again.json()["duplicate"]) == (200, True)


async def test_a_late_report_after_the_lease_moved_on_is_refused_with_409(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await publisher(driver).send(Task("t1", "job", None))
    [first] = (await lease(http, "ex-1"))["tasks"]
    tick(driver, 31_000)  # no ping: the lease expired; the lease pass marks it lost
    assert (await lease(http, "ex-2"))["tasks"] == []  # retried after the policy's delay (10 s)
    tick(driver, 10_000)
    [second] = (await lease(http, "ex-2"))["tasks"]  # ex-2 takes over
    assert second["key"] == "t1" and second["attempt_no"] == 2
    late = await report(http, first, "ex-1", outcome="succeeded", result="late")
    assert late.status_code == 409
    assert late.json()["error"] == "lease_lost"
    assert "t1" in late.json()["detail"] and "not recorded" in late.json()["detail"]
    ping = await http.post(
        PING, json={"worker_id": "ex-1", "tasks": [{"key": "t1", "attempt": first["attempt"]}]}, headers=EXEC
    )
    assert ping.json()["tasks"][0]["state"] == "lost"
    info = await task_of(http, "t1")
    assert info["status"] == "running" and [a["status"] for a in info["worker_states"]] == ["lost", "running"]
    ok = await report(http, second, "ex-2", outcome="succeeded", result="on time")
    assert ok.status_code == 200
    assert (await task_of(http, "t1"))["worker_states"][1]["result"] == "on time"


async def test_an_unknown_task_and_a_stranger_s_attempt_are_answered_alike(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    # a report cannot tell whether a task exists, nor its status, unless the attempt is the
    # reporting worker's own: the same 409 for both, naming nothing it did not send
    await publisher(driver).send(Task("t1", "job", None))
    [task] = (await lease(http, "ex-1"))["tasks"]
    for outcome in ("succeeded", "failed"):
        missing = await report(http, {"key": "nope", "attempt": task["attempt"]}, "ex-2", outcome=outcome)
        stranger = await report(http, task, "ex-2", outcome=outcome)
        answers = [
            (r.status_code, r.json()["error"], r.json()["detail"].replace("'nope'", "'t1'"))
            for r in (missing, stranger)
        ]
        assert answers[0] == answers[1] and answers[0][:2] == (409, "lease_lost"), answers
        assert "running" not in stranger.text and "pending" not in stranger.text
    assert (await task_of(http, "t1"))["status"] == "running"


async def test_failures_follow_the_task_retry_policy_and_budget(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    option = TaskOption(retry=FixedRetry(delay=timedelta(seconds=7), max_retries=1))
    await publisher(driver).send(Task("t1", "job", None, option=option))
    [task] = (await lease(http))["tasks"]
    failed = await report(http, task, outcome="failed", error={"type": "IOError", "message": "disk"})
    assert failed.status_code == 200, failed.text
    body = failed.json()
    assert (body["status"], body["final"], body["error"]["type"]) == ("failed", False, "IOError")
    assert body["retry_at"].startswith((driver.clock.now() + timedelta(seconds=7)).isoformat()[:19])
    assert (await lease(http))["tasks"] == []  # not before retry_at
    tick(driver, 7_000)
    [task] = (await lease(http))["tasks"]
    assert task["failures"] == 1
    await report(http, task, outcome="failed", error={"message": "again"})
    info = await task_of(http, "t1")
    assert info["status"] == "failed"  # the budget (1 retry) is used


async def test_retry_after_final_snooze_release_and_oversized_results(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    keys = ["retry", "final", "snooze", "release", "big"]
    await publisher(driver).send_many([Task(k, "job", None) for k in keys])
    leased = {t["key"]: t for t in (await lease(http, max_tasks=5))["tasks"]}
    assert sorted(leased) == sorted(keys)
    r = (await report(http, leased["retry"], outcome="failed", retry_after=60)).json()
    assert (r["status"], r["error"]["type"]) == ("failed", "Retry")
    f = (await report(http, leased["final"], outcome="failed", final=True, error={"message": "bad"})).json()
    assert (f["status"], f["final"], f["error"]["type"]) == ("failed", True, "Fail")
    s = (await report(http, leased["snooze"], outcome="snoozed", retry_after=30)).json()
    assert (s["status"], s["error"]["type"]) == ("snoozed", "Snooze")
    rel = (await report(http, leased["release"], outcome="released")).json()
    assert rel["status"] == "released"
    big = (await report(http, leased["big"], outcome="succeeded", result="x" * 600_000)).json()
    assert (big["status"], big["error"]["type"]) == ("rejected", "ResultTooLarge")
    statuses = {k: (await task_of(http, k))["status"] for k in keys}
    assert statuses == {
        "retry": "pending",
        "final": "failed",
        "snooze": "pending",
        "release": "pending",
        "big": "failed",
    }
    [again] = (await lease(http))["tasks"]  # only the released one is due now
    assert again["key"] == "release" and again["failures"] == 0


async def test_targeting_and_fan_out_are_the_consumers(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await publisher(driver).send_many(
        [
            Task("mine", "job", None, option=TaskOption(specific_worker_ids=("ex-2",))),
            Task("fan", "job", None, option=TaskOption(concurrent_worker_cnt=2)),
        ]
    )
    one = [t["key"] for t in (await lease(http, "ex-1", max_tasks=5))["tasks"]]
    two = [t["key"] for t in (await lease(http, "ex-2", max_tasks=5))["tasks"]]
    assert one == ["fan"] and sorted(two) == ["fan", "mine"]
    assert (await lease(http, "ex-1", max_tasks=5))["tasks"] == []  # already runs "fan"


async def test_a_long_poll_returns_when_a_task_arrives(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    waiting = asyncio.ensure_future(lease(http, wait_seconds=30))
    await settle()
    assert not waiting.done()
    await publisher(driver).send(Task("t1", "job", None))
    # no fake time passes: the store's change feed wakes the lease
    await wait_until(waiting.done, what="the long poll to return")
    assert [t["key"] for t in waiting.result()["tasks"]] == ["t1"]


async def test_a_long_poll_wakes_at_a_known_run_at_and_ends_at_its_wait(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    clock = driver.clock
    assert isinstance(clock, FakeClock)
    await publisher(driver).send(
        Task("later", "job", None, option=TaskOption(run_at=clock.now() + timedelta(seconds=3)))
    )
    waiting = asyncio.ensure_future(lease(http, wait_seconds=10))
    await settle()
    for _ in range(2):
        clock.advance(1)
        await settle()
    assert not waiting.done()
    clock.advance(1)
    await wait_until(waiting.done, what="the long poll to wake at run_at")
    assert [t["key"] for t in waiting.result()["tasks"]] == ["later"]
    empty = asyncio.ensure_future(lease(http, wait_seconds=2))
    for _ in range(12):
        clock.advance(0.25)
        await settle()
    assert empty.done() and empty.result()["tasks"] == []


async def test_a_remote_stop_reaches_the_executor(http: httpx.AsyncClient, driver: CountingDriver) -> None:
    await lease(http, "ex-1")
    assert (await http.post("/api/v1/workers/ex-1/stop", headers=ADMIN)).status_code == 202
    tick(driver, 6_000)  # the next heartbeat
    await publisher(driver).send(Task("t1", "job", None))
    answer = await lease(http, "ex-1")
    assert answer == {"tasks": [], "stop_requested": True}
    assert (await driver.get_task("t1"))["state"]["status"] == "pending"  # type: ignore[index]


async def test_a_remote_stop_survives_the_executor_reaching_another_server(
    http: httpx.AsyncClient, driver: CountingDriver, operations: Operations
) -> None:
    """Two API servers over one store: the executor leases through one, an operator stops it,
    its next lease reaches the other (which registers it, never having seen it): that
    registration keeps the stop, and the lease answers it without claiming."""
    await lease(http, "ex-1")
    assert (await http.post("/api/v1/workers/ex-1/stop", headers=ADMIN)).status_code == 202
    await publisher(driver).send(Task("t1", "job", None))
    other = create_app(operations=operations, tokens=TOKENS)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=other), base_url="http://test") as second:
        assert await lease(second, "ex-1") == {"tasks": [], "stop_requested": True}
    assert (await driver.get_task("t1"))["state"]["status"] == "pending"  # type: ignore[index]
    [worker] = await driver.list_workers()
    assert worker["stop_time"] is not None  # served: a later lease registers it afresh


async def test_a_task_aimed_at_a_group_goes_to_an_executor_in_that_group(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await publisher(driver).send(Task("gpu-job", "job", None, option=TaskOption(specific_groups=("gpu",))))
    assert (await lease(http, "ex-cpu", groups=["cpu"]))["tasks"] == []
    assert (await lease(http, "ex-none"))["tasks"] == []
    [task] = (await lease(http, "ex-gpu", groups=["gpu", "eu"]))["tasks"]
    assert task["key"] == "gpu-job"
    registered = {w["worker_id"]: w["groups"] for w in await driver.list_workers()}
    assert (registered["ex-gpu"], registered["ex-none"]) == (["gpu", "eu"], [])  # shown by workers ls
    # a ping without groups renews with those of the lease; naming other groups revokes it
    item = {"key": "gpu-job", "attempt": task["attempt"]}
    alive = await http.post(PING, json={"worker_id": "ex-gpu", "tasks": [item]}, headers=EXEC)
    assert alive.json()["tasks"][0]["state"] == "alive"
    body = {"worker_id": "ex-gpu", "tasks": [item], "groups": ["gpu"]}
    assert (await http.post(PING, json=body, headers=EXEC)).json()["tasks"][0]["state"] == "alive"
    body["groups"] = ["cpu"]
    assert (await http.post(PING, json=body, headers=EXEC)).json()["tasks"][0]["state"] == "revoked"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (LEASE, {"worker_id": "ex", "names": []}),
        (LEASE, {"worker_id": "$ex", "names": ["job"]}),
        (LEASE, {"worker_id": "ex", "names": ["job"], "wait_seconds": 61}),
        (LEASE, {"worker_id": "ex", "names": ["job"], "max_tasks": 0}),
        (LEASE, {"worker_id": "ex", "names": ["job"], "$where": 1}),
        (LEASE, {"worker_id": {"$gt": ""}, "names": ["job"]}),
        (LEASE, {"worker_id": "ex", "names": ["job"], "groups": ["$gpu"]}),
        (LEASE, {"worker_id": "ex", "names": ["job"], "groups": "gpu"}),
        (PING, {"worker_id": "ex", "tasks": [{"key": "t1", "attempt": "a"}], "groups": ["bad group"]}),
        (PING, {"worker_id": "ex", "tasks": []}),
        (PING, {"worker_id": "ex", "tasks": [{"key": "t1", "attempt": "a", "progress": {"fraction": 2}}]}),
        (PING, {"worker_id": "ex", "tasks": [{"key": "t1", "attempt": "a", "checkpoint": {"$set": 1}}]}),
        (PING, {"worker_id": "ex", "tasks": [{"key": "t1", "attempt": "a"}, {"key": "t1", "attempt": "a"}]}),
        (REPORT, {"worker_id": "ex", "key": "t1", "attempt": "a", "outcome": "done"}),
        (REPORT, {"worker_id": "ex", "key": "t1", "attempt": "a", "outcome": "snoozed"}),
        (REPORT, {"worker_id": "ex", "key": "t1", "attempt": "a", "outcome": "succeeded", "final": True}),
        (REPORT, {"worker_id": "ex", "key": "t1", "attempt": "a", "outcome": "failed", "result": 1}),
        (REPORT, {"worker_id": "ex", "key": "t1", "attempt": "a", "outcome": "failed", "retry_after": -1}),
    ],
)
async def test_bad_input_is_422_and_changes_nothing(
    http: httpx.AsyncClient, driver: CountingDriver, path: str, body: dict[str, Any]
) -> None:
    await publisher(driver).send(Task("t1", "job", None))
    before = await driver.get_task("t1")
    response = await http.post(path, json=body, headers=EXEC)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"
    assert await driver.get_task("t1") == before
    assert await driver.list_workers() == []


async def test_only_executor_and_admin_tokens_may_use_the_executor_routes(
    http: httpx.AsyncClient, driver: CountingDriver
) -> None:
    body = {"worker_id": "ex", "names": ["job"]}
    assert (await http.post(LEASE, json=body, headers=READ)).status_code == 403
    assert (await http.post(LEASE, json=body, headers=ADMIN)).status_code == 200
    assert (await http.post(LEASE, json=body, headers=EXEC)).status_code == 200
    for method, path in (
        ("GET", "/api/v1/tasks"),
        ("GET", "/api/v1/workers"),
        ("POST", "/api/v1/tasks/x/cancel"),
    ):
        refused = await http.request(method, path, headers=EXEC)
        assert refused.status_code == 403, (method, path)
        assert "executor" in refused.json()["detail"]


def test_the_documented_executor_example_runs_as_printed() -> None:
    repo = Path(__file__).resolve().parents[2]
    page = (repo / "docs" / "api.md").read_text(encoding="utf-8")
    section = page.split("\n## Remote executors over HTTP\n", 1)[1].split("\n## ", 1)[0]
    [example] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    done = subprocess.run(
        [sys.executable, "-c", example], cwd=repo, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.strip()
    assert printed == "succeeded resizer-1 {'width': 640}"
    assert f"prints `{printed}`" in section


async def test_executor_attempts_are_in_the_event_log() -> None:
    clock = FakeClock()
    driver = MemoryDriver(clock=clock, events=True)
    app = create_app(operations=Operations(driver, clock=clock), tokens=TOKENS)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        await publisher(driver).send_many([Task("ok", "job", None), Task("bad", "job", None)])
        leased = {t["key"]: t for t in (await lease(http, max_tasks=2))["tasks"]}
        await report(http, leased["ok"], outcome="succeeded", result=1)
        await report(http, leased["bad"], outcome="failed", final=True, error={"message": "no"})
    events = await driver.list_events(EventQuery(keys=["ok", "bad"], limit=100))
    kinds = sorted((e["key"], e["kind"], e.get("worker_id")) for e in events if e["kind"] != "sent")
    assert kinds == [
        ("bad", "claimed", "ex-1"),
        ("bad", "failed", "ex-1"),
        ("ok", "claimed", "ex-1"),
        ("ok", "succeeded", "ex-1"),
    ]


async def test_an_executor_told_to_stop_has_its_attempt_settled_at_the_answer(
    http: httpx.AsyncClient, driver: CountingDriver, operations: Operations
) -> None:
    """Issue 17 A1: a ping answered ``cancelled`` / ``paused`` / ``revoked`` tells the executor to
    stop and report nothing; the service settles the attempt there (fenced), so the task is not
    held until the lease runs out, and a restart or a resume may follow at once."""
    await publisher(driver).send_many([Task(k, "job") for k in ("t1", "t2", "t3")])
    got = await lease(http, max_tasks=3)
    attempts = {t["key"]: t["attempt"] for t in got["tasks"]}
    assert sorted(attempts) == ["t1", "t2", "t3"]
    await operations.cancel("t1", "not needed")
    await operations.pause("t2", stop_running=True)
    await operations.edit("t3", OptionChange(specific_worker_ids=("someone-else",)))
    items = [{"key": k, "attempt": a} for k, a in sorted(attempts.items())]
    answer = await http.post(PING, json={"worker_id": "ex-1", "tasks": items}, headers=EXEC)
    assert [t["state"] for t in answer.json()["tasks"]] == ["cancelled", "paused", "revoked"]
    t1, t2, t3 = [await operations.get_task(k) for k in ("t1", "t2", "t3")]
    assert [w.status.value for w in t1.worker_states] == ["cancelled"] and t1.fail_cnt == 0
    assert [w.status.value for w in t2.worker_states] == ["released"] and t2.status.value == "pending"
    assert [w.status.value for w in t3.worker_states] == ["revoked"] and t3.running_cnt == 0
    assert (await operations.restart("t1")).status.value == "pending"  # nothing runs: at once
    await operations.resume("t2")
    again = await lease(http, "ex-2", max_tasks=3)
    assert sorted(t["key"] for t in again["tasks"]) == ["t1", "t2"]


async def test_executor_events_store_what_was_reported() -> None:
    """Issue 17 A4: a succeeded report's event names the task and the attempt number (not ``""``
    and 0); a final failure keeps the reported error type (not "Fail"), on the attempt and in its
    event; a final failure reported without a type is ``Fail``, as a Python handler's."""
    clock = FakeClock()
    driver = MemoryDriver(clock=clock, events=True)
    app = create_app(operations=Operations(driver, clock=clock), tokens=TOKENS)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        await publisher(driver).send_many([Task(k, "job", None) for k in ("ok", "bad", "plain")])
        leased = {t["key"]: t for t in (await lease(http, max_tasks=3))["tasks"]}
        await report(http, leased["ok"], outcome="succeeded", result=1)
        error = {"type": "DiskFull", "message": "no space left"}
        answer = (await report(http, leased["bad"], outcome="failed", final=True, error=error)).json()
        assert (answer["final"], answer["error"]["type"]) == (True, "DiskFull")
        untyped = (await report(http, leased["plain"], outcome="failed", final=True)).json()
        assert untyped["error"]["type"] == "Fail"
    events = await driver.list_events(EventQuery(keys=["ok", "bad"], limit=100))
    ended = {e["key"]: e for e in events if e["kind"] in ("succeeded", "failed")}
    assert (ended["ok"]["name"], ended["ok"]["attempt"]) == ("job", 1)
    assert (ended["bad"]["name"], ended["bad"]["attempt"], ended["bad"]["kind"]) == ("job", 1, "failed")
    assert ended["bad"]["detail"]["error"] == "DiskFull: no space left"
    info = await Operations(driver, clock=clock).get_task("bad")
    assert info.status.value == "failed" and info.worker_states[0].error is not None
    assert info.worker_states[0].error.type == "DiskFull" and info.worker_states[0].final


class RawLease:
    """One ``POST /executors/lease`` straight through the ASGI app, with a client that can hang
    up: ``hang_up()`` makes the next ``receive()`` answer ``http.disconnect``, as a server does
    when the connection closes."""

    def __init__(self, app: Any, body: dict[str, Any]) -> None:
        self.app = app
        self.body = json.dumps(body).encode()
        self.gone = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    def hang_up(self) -> None:
        self.gone.set()

    async def receive(self) -> dict[str, Any]:
        if self.body:
            body, self.body = self.body, b""
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def __call__(self) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": LEASE,
            "raw_path": LEASE.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"content-type", b"application/json"),
                (b"authorization", EXEC["Authorization"].encode()),
            ],
            "client": ("127.0.0.1", 5000),
            "server": ("test", 80),
        }
        await self.app(scope, self.receive, self.send)


async def test_a_long_poll_whose_client_went_away_claims_nothing(
    driver: CountingDriver, operations: Operations
) -> None:
    """Issue 17 D16: the lease stops waiting when its client disconnects; a task sent afterwards
    is not claimed for nobody (it would run out its 30 s lease and cost a retry)."""
    app = create_app(operations=operations, tokens=TOKENS)
    call = RawLease(app, {"worker_id": "ex-1", "names": ["job"], "wait_seconds": 30})
    request = asyncio.ensure_future(call())
    await settle()
    assert not request.done()  # waiting for work
    call.hang_up()
    await wait_until(request.done, what="the lease to stop waiting")  # without the clock moving
    await publisher(driver).send(Task("t1", "job"))
    await settle()
    info = await operations.get_task("t1")
    assert info.status.value == "pending" and info.worker_states == []


async def test_a_lease_whose_answer_cannot_be_delivered_is_released_at_once(
    driver: CountingDriver, operations: Operations
) -> None:
    """Issue 17 D16: the client hung up while its claim was being made: the attempt is given back
    at once (released: no retry used, claimable again now), not left to run out its lease."""
    await publisher(driver).send(Task("t1", "job", option=TaskOption(max_unexpected_retries=0)))
    app = create_app(operations=operations, tokens=TOKENS)
    call = RawLease(app, {"worker_id": "ex-1", "names": ["job"]})
    call.hang_up()  # gone by the time the answer is ready
    await call()
    info = await operations.get_task("t1")
    assert [w.status.value for w in info.worker_states] == ["released"]
    assert info.status.value == "pending" and info.fail_cnt == 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        [task] = (await lease(http, "ex-2"))["tasks"]  # at once, not 30 s later
    assert task["key"] == "t1"


async def test_a_lease_cancelled_mid_claim_gives_back_what_the_claim_took(
    driver: CountingDriver, operations: Operations
) -> None:
    """Issue 17 D16, at the service: the request is cancelled while its claim is in flight (the
    store applies it after): the claim is waited for and its attempt released at once."""
    gate, claiming = asyncio.Event(), asyncio.Event()
    inner_claim = driver.claim

    async def slow_claim(params: Any) -> Any:
        claiming.set()
        await gate.wait()
        return await inner_claim(params)

    driver.claim = slow_claim  # type: ignore[method-assign]
    await publisher(driver).send(Task("t1", "job"))
    service = RemoteExecutors(driver, clock=driver.clock)
    leasing = asyncio.ensure_future(service.lease("ex-1", ["job"]))
    await wait_until(claiming.is_set, what="the claim to be in flight")
    leasing.cancel()
    await settle()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await leasing
    info = await operations.get_task("t1")
    assert [w.status.value for w in info.worker_states] == ["released"] and info.fail_cnt == 0


async def test_leases_rotate_across_fairness_keys(http: httpx.AsyncClient, driver: CountingDriver) -> None:
    """A key with a backlog does not hold up another: one-task leases alternate between keys."""
    big, small = TaskOption(fair_key="big"), TaskOption(fair_key="small")
    await publisher(driver).send_many([Task(f"big-{i}", "job", option=big) for i in range(20)])
    await publisher(driver).send_many([Task(f"small-{i}", "job", option=small) for i in range(2)])
    leased = []
    for _ in range(5):
        [task] = (await lease(http, max_tasks=1))["tasks"]
        leased.append(task["key"].split("-")[0])
        assert (await report(http, task, outcome="succeeded")).status_code == 200
    assert leased.count("small") == 2, leased
    assert leased.index("small") <= 1 and leased[:4].count("small") == 2, leased
