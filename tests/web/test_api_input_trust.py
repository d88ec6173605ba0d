"""What the API takes and what it says back: control characters refused in every identifier a
route carries, refusals that never echo the refused value, a cap on the worker ids one executor
token leases as, and an optional publish rate per token."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, MemoryDriver, Operations
from mscheduler.web import ApiTokens, create_app
from mscheduler.web.guards import ApiLimits
from tests.web.support import live_worker

ADMIN = "admin-trust-token-0123456789abcdef"
PUBLISH = "publish-trust-token-0123456789abcd"
EXECUTOR = "executor-trust-token-0123456789abc"


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def driver() -> MemoryDriver:
    return MemoryDriver(clock=FakeClock())


def _client(driver: MemoryDriver, limits: ApiLimits | None = None) -> httpx.AsyncClient:
    tokens = ApiTokens(admin=[ADMIN], publish=[PUBLISH], executor=[EXECUTOR])
    app = create_app(operations=Operations(driver, clock=driver.clock), tokens=tokens, limits=limits)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "tab\there", "esc\x1b[2J", "del\x7f", "c1\x85"])
async def test_control_characters_are_refused_in_every_identifier(driver: MemoryDriver, bad: str) -> None:
    async with _client(driver) as http:
        sent = await http.post("/api/v1/tasks", json={"key": bad, "name": "job"}, headers=_as(PUBLISH))
        assert sent.status_code == 422 and "control characters" in sent.json()["detail"]
        plan = {"plan_id": bad, "name": "job", "timing": {"schedule": {"kind": "every", "interval": 60}}}
        assert (await http.post("/api/v1/plans", json=plan, headers=_as(ADMIN))).status_code == 422
        lease = {"worker_id": bad, "names": ["job"]}
        assert (
            await http.post("/api/v1/executors/lease", json=lease, headers=_as(EXECUTOR))
        ).status_code == 422
        listed = await http.get("/api/v1/tasks", params={"worker_id": bad}, headers=_as(ADMIN))
        assert listed.status_code == 422
    assert await driver.count_by_status() == {}  # nothing was stored


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v1/tasks", {"key": "k", "name": "job", "option": {"priority": "VALUE<script>"}}),
        ("POST", "/api/v1/tasks", {"key": "k", "name": "VALUE<script>"}),
        (
            "POST",
            "/api/v1/tasks",
            {"key": "k", "name": "job", "option": {"retry": {"kind": "VALUE<script>"}}},
        ),
        ("POST", "/api/v1/tasks", {"key": "k", "name": "job", "option": {"run_at": "VALUE<script>"}}),
        (
            "POST",
            "/api/v1/plans",
            {
                "plan_id": "p",
                "name": "job",
                "timing": {"schedule": {"kind": "cron", "expression": "VALUE<script>"}},
            },
        ),
        ("PUT", "/api/v1/limits/job", {"rate": "VALUE<script>"}),
        ("POST", "/api/v1/executors/lease", {"worker_id": "w", "names": ["VALUE<script>"]}),
        ("GET", "/api/v1/tasks?status=VALUE<script>", None),
    ],
)
async def test_a_refusal_names_the_field_and_the_rule_never_the_value(
    driver: MemoryDriver, method: str, path: str, body: Any
) -> None:
    async with _client(driver) as http:
        answer = await http.request(method, path, json=body, headers=_as(ADMIN))
    assert answer.status_code == 422
    assert "VALUE" not in answer.text and "http" not in answer.text, answer.text


async def test_an_executor_token_leases_as_at_most_so_many_worker_ids(driver: MemoryDriver) -> None:
    async with _client(driver, ApiLimits(workers_per_token=3)) as http:
        for n in range(3):
            lease = {"worker_id": f"ex-{n}", "names": ["job"]}
            assert (
                await http.post("/api/v1/executors/lease", json=lease, headers=_as(EXECUTOR))
            ).status_code == 200
        again = {"worker_id": "ex-1", "names": ["job"]}  # one it leased as already: fine
        assert (
            await http.post("/api/v1/executors/lease", json=again, headers=_as(EXECUTOR))
        ).status_code == 200
        more = await http.post(
            "/api/v1/executors/lease", json={"worker_id": "ex-new", "names": ["job"]}, headers=_as(EXECUTOR)
        )
        assert more.status_code == 429 and more.json()["error"] == "too_many_workers"
        assert "Retry-After" in more.headers
    workers = {w["worker_id"] for w in await driver.list_workers()}
    assert workers == {"ex-0", "ex-1", "ex-2"}  # the refused lease registered nothing


async def test_a_publish_rate_per_token_when_one_is_set(driver: MemoryDriver) -> None:
    await live_worker(driver, "job")  # the door check lets the sends through
    now = [0.0]
    async with _client(driver, ApiLimits(publish_rate=10, publish_burst=20)) as http:
        http_app = http._transport.app  # type: ignore[attr-defined]
        http_app.state.publish_rate.clock = lambda: now[0]
        batch = {"tasks": [{"key": f"a{i}", "name": "job"} for i in range(15)]}
        assert (await http.post("/api/v1/tasks", json=batch, headers=_as(PUBLISH))).status_code == 201
        second = {"tasks": [{"key": f"b{i}", "name": "job"} for i in range(10)]}
        refused = await http.post("/api/v1/tasks", json=second, headers=_as(PUBLISH))
        assert refused.status_code == 429 and refused.json()["error"] == "too_many_sends"
        assert refused.headers["Retry-After"] == "1"
        other = await http.post("/api/v1/tasks", json=second, headers=_as(ADMIN))  # its own bucket
        assert other.status_code == 201
        now[0] = 1.0  # 10 more tasks a second later
        third = {"tasks": [{"key": f"c{i}", "name": "job"} for i in range(10)]}
        assert (await http.post("/api/v1/tasks", json=third, headers=_as(PUBLISH))).status_code == 201
        huge = {"tasks": [{"key": f"d{i}", "name": "job"} for i in range(21)]}
        assert (await http.post("/api/v1/tasks", json=huge, headers=_as(PUBLISH))).status_code == 422
    async with _client(driver) as http:  # no rate by default
        for n in range(3):
            many = {"tasks": [{"key": f"e{n}-{i}", "name": "job"} for i in range(1000)]}
            assert (await http.post("/api/v1/tasks", json=many, headers=_as(PUBLISH))).status_code == 201
