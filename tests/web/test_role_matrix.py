"""What each role may do to what it does not own — actions, not routes — on every driver.

A store holds another party's things: a finished task, a running one (its attempt token is the
owner's secret), a pending one aimed at worker ``owner-1``, a plan with a predictable next run
key, a flow limit whose slot the running attempt holds, and the worker ``owner-1``. Each role
(read, publish, executor bound to ``mine-*``, executor unbound, admin) tries each action once, on
a fresh store; the table says what it must be answered, and a refusal must change nothing.

What unbound executor and admin tokens may do (act as any worker id, so report an attempt whose
token they hold) is their documented power: docs/api.md's role table says the same as this one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, Operations
from mscheduler.domain.plans import occurrence_key
from mscheduler.web import ApiTokens, Token, create_app
from tests.conftest import DriverFactory

TOKENS = {
    "read": "matrix-read-token-0123456789abcdef",
    "publish": "matrix-publish-token-0123456789abc",
    "executor-bound": "matrix-bound-token-0123456789abcde",
    "executor-unbound": "matrix-free-token-0123456789abcdef",
    "admin": "matrix-admin-token-0123456789abcdef",
}
ROLES = tuple(TOKENS)
PLAN_START = timedelta(hours=1)  # the plan's first run, from the store's clock


@dataclass
class Scene:
    http: httpx.AsyncClient
    attempt: str  # the running task's attempt token (the owner's secret)
    run_key: str  # the plan's next run key


@dataclass
class Action:
    """One thing a role may try: the request, the answer per role, and what else to check."""

    request: Callable[[Scene], tuple[str, str, Any]]  # (method, path, JSON body or None)
    expected: dict[str, int]
    check: Callable[[Scene, str, httpx.Response], None] | None = field(default=None)


def _everyone_but(admin: int, **others: int) -> dict[str, int]:
    """403 for every role not named (the route is not theirs), ``admin`` for the admin token."""
    return {role: others.get(role.replace("-", "_"), 403) for role in ROLES} | {"admin": admin}


def _attempt_shown(scene: Scene, role: str, answer: httpx.Response) -> None:
    attempts = [w["attempt"] for w in answer.json()["worker_states"]]
    assert attempts == ([scene.attempt] if role == "admin" else [""])


def _holders_shown(scene: Scene, role: str, answer: httpx.Response) -> None:
    attempts = [h["attempt"] for h in answer.json()["holders"]]
    assert attempts == ([scene.attempt] if role == "admin" else [""])


def _leased(keys: list[str]) -> Callable[[Scene, str, httpx.Response], None]:
    def check(scene: Scene, role: str, answer: httpx.Response) -> None:
        assert [t["key"] for t in answer.json()["tasks"]] == keys

    return check


def _ping_lost(scene: Scene, role: str, answer: httpx.Response) -> None:
    assert [t["state"] for t in answer.json()["tasks"]] == ["lost"]


def _report(worker: str, key: str = "victim-running") -> Callable[[Scene], tuple[str, str, Any]]:
    def request(scene: Scene) -> tuple[str, str, Any]:
        body = {"worker_id": worker, "key": key, "attempt": scene.attempt, "outcome": "succeeded"}
        return "POST", "/api/v1/executors/report", body

    return request


ACTIONS: dict[str, Action] = {
    "create a task": Action(
        # a name a live worker handles (the door check refuses others)
        lambda s: ("POST", "/api/v1/tasks", {"key": "new", "name": "finish"}),
        _everyone_but(201, publish=201),
    ),
    "create a plan's next run (squat its key)": Action(
        lambda s: ("POST", "/api/v1/tasks", {"key": s.run_key, "name": "mail"}),
        _everyone_but(422, publish=422),
    ),
    "create a parent's child (squat its key)": Action(
        lambda s: ("POST", "/api/v1/tasks", {"key": "etl/fetch", "name": "mail"}),
        _everyone_but(422, publish=422),
    ),
    "reset a finished task it did not send": Action(
        lambda s: ("POST", "/api/v1/tasks?reset_finished=true", {"key": "victim-finished", "name": "finish"}),
        _everyone_but(201),
    ),
    "cancel a task": Action(
        lambda s: ("POST", "/api/v1/tasks/victim-pending/cancel", None), _everyone_but(200)
    ),
    "restart a finished task": Action(
        lambda s: ("POST", "/api/v1/tasks/victim-finished/restart?force=true", None), _everyone_but(200)
    ),
    "remove a task": Action(lambda s: ("DELETE", "/api/v1/tasks/victim-finished", None), _everyone_but(204)),
    "change a limit": Action(lambda s: ("PUT", "/api/v1/limits/job", {"max_running": 1}), _everyone_but(200)),
    "run a plan now": Action(lambda s: ("POST", "/api/v1/plans/nightly/run", None), _everyone_but(201)),
    "stop a worker": Action(lambda s: ("POST", "/api/v1/workers/owner-1/stop", None), _everyone_but(202)),
    "lease, as itself, a task aimed at another worker": Action(
        lambda s: ("POST", "/api/v1/executors/lease", {"worker_id": "mine-1", "names": ["mail"]}),
        _everyone_but(200, executor_bound=200, executor_unbound=200),
        _leased([]),
    ),
    "lease as another worker": Action(
        lambda s: ("POST", "/api/v1/executors/lease", {"worker_id": "owner-1", "names": ["mail"]}),
        _everyone_but(200, executor_unbound=200),
        _leased(["victim-pending"]),
    ),
    "report another worker's attempt, as itself": Action(
        _report("mine-1"), _everyone_but(409, executor_bound=409, executor_unbound=409)
    ),
    "report on a task that does not exist": Action(
        _report("mine-1", key="no-such-task"), _everyone_but(409, executor_bound=409, executor_unbound=409)
    ),
    "report another worker's attempt, as that worker": Action(
        _report("owner-1"), _everyone_but(200, executor_unbound=200)
    ),
    "ping another worker's attempt, as itself": Action(
        lambda s: (
            "POST",
            "/api/v1/executors/ping",
            {"worker_id": "mine-1", "tasks": [{"key": "victim-running", "attempt": s.attempt}]},
        ),
        _everyone_but(200, executor_bound=200, executor_unbound=200),
        _ping_lost,
    ),
    "read a running task's attempt token": Action(
        lambda s: ("GET", "/api/v1/tasks/victim-running", None), _everyone_but(200, read=200), _attempt_shown
    ),
    "read a limit holder's attempt token": Action(
        lambda s: ("GET", "/api/v1/limits/job", None), _everyone_but(200, read=200), _holders_shown
    ),
}


def _as(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


@pytest.fixture
async def scene(make_driver: DriverFactory) -> AsyncIterator[Scene]:
    clock = FakeClock()
    driver = make_driver(clock)
    await driver.setup()
    tokens = ApiTokens(
        read=[TOKENS["read"]],
        publish=[TOKENS["publish"]],
        executor=[
            Token(TOKENS["executor-bound"], name="bound", worker_prefix="mine-", tasks=("job", "mail")),
            TOKENS["executor-unbound"],
        ],
        admin=[TOKENS["admin"]],
    )
    app = create_app(operations=Operations(driver, clock=clock), tokens=tokens)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        admin = _as("admin")

        async def ok(method: str, path: str, body: Any = None) -> Any:
            answer = await http.request(method, path, json=body, headers=admin)
            assert answer.status_code < 300, (path, answer.text)
            return answer.json() if answer.content else None

        start = (clock.now() + PLAN_START).isoformat()
        plan = {
            "plan_id": "nightly",
            "name": "mail",
            "timing": {"schedule": {"kind": "every", "interval": 3600, "start": start}},
        }
        await ok("POST", "/api/v1/plans", plan)
        await ok("PUT", "/api/v1/limits/job", {"max_running": 5})
        await ok(
            "POST",
            "/api/v1/tasks?allow_unknown=true",  # their workers lease below
            {
                "tasks": [
                    {"key": "victim-finished", "name": "finish"},
                    {"key": "victim-running", "name": "job"},
                    {"key": "victim-pending", "name": "mail", "option": {"specific_worker_ids": ["owner-1"]}},
                ]
            },
        )
        lease = "/api/v1/executors/lease"
        [done] = (await ok("POST", lease, {"worker_id": "owner-1", "names": ["finish"]}))["tasks"]
        report = {
            "worker_id": "owner-1",
            "key": done["key"],
            "attempt": done["attempt"],
            "outcome": "succeeded",
        }
        await ok("POST", "/api/v1/executors/report", report)
        [running] = (await ok("POST", lease, {"worker_id": "owner-1", "names": ["job"]}))["tasks"]
        yield Scene(http, running["attempt"], occurrence_key("nightly", clock.now() + PLAN_START))


async def _state(scene: Scene) -> list[Any]:
    """What the owner's things look like (read by the admin), to compare around a refusal."""
    admin = _as("admin")
    paths = [
        "/api/v1/tasks?limit=100",
        "/api/v1/plans/nightly",
        "/api/v1/limits/job",
        "/api/v1/workers",
    ]
    return [(await scene.http.get(path, headers=admin)).json() for path in paths]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", list(ACTIONS))
async def test_what_each_role_may_do_to_what_it_does_not_own(scene: Scene, action: str, role: str) -> None:
    spec = ACTIONS[action]
    method, path, body = spec.request(scene)
    before = await _state(scene)
    answer = await scene.http.request(method, path, json=body, headers=_as(role))
    assert answer.status_code == spec.expected[role], (action, role, answer.text)
    if answer.status_code >= 400:
        assert await _state(scene) == before, (action, role)  # a refusal changes nothing
        assert scene.attempt not in answer.text  # nor tells a secret
    elif spec.check is not None:
        spec.check(scene, role, answer)
