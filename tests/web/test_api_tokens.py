"""Tokens (issue 20, item 11): weak ones refused or warned about, one token under two roles
refused, a tokens file others may read warned about; tokens have names and operator actions
record them; executor tokens bound to a worker-id prefix, task names and groups; attempt tokens
never shown to read tokens (tasks, limits, event ids)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from mscheduler import FakeClock, MemoryDriver, Operations, Task
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web import ApiTokens, Role, create_app, parse_tokens, read_tokens_file
from tests.web.support import ADMIN_TOKEN, READ_TOKEN, publisher

RESIZER_TOKEN = "resizer-token-7c41d09a2be5f318"
FREE_EXECUTOR_TOKEN = "executor-token-0123456789abcdef"


def test_weak_tokens_are_refused_or_warned_about() -> None:
    with pytest.raises(InvalidInput, match="too easy to guess") as weak:
        ApiTokens(admin=["aaaaaaaaaaaaaaaaaaaa"])
    assert "aaaa" not in str(weak.value)
    with pytest.raises(InvalidInput, match="too easy to guess"):
        parse_tokens("read:abababababababababab")
    tokens = ApiTokens(admin=[ADMIN_TOKEN], read=["0123456789abcdef"])
    assert len(tokens.warnings) == 1
    assert "'read-1' looks easy to guess" in tokens.warnings[0]
    assert "0123456789abcdef" not in tokens.warnings[0]
    assert ApiTokens(admin=[ADMIN_TOKEN], read=[READ_TOKEN]).warnings == ()


def test_one_token_under_two_roles_is_refused() -> None:
    with pytest.raises(InvalidInput, match="one token, one role") as both:
        parse_tokens(f"admin:{ADMIN_TOKEN}\nread:{ADMIN_TOKEN}")
    assert ADMIN_TOKEN not in str(both.value)
    twice = parse_tokens(f"read:{READ_TOKEN}\nread:{READ_TOKEN}")
    assert twice.role_of(READ_TOKEN) is Role.READ
    assert twice.warnings == ("read token #2 repeats read token #1",)


def test_tokens_have_names_and_the_file_format_keeps_the_old_lines(tmp_path: Path) -> None:
    tokens = parse_tokens(
        f"# ops\nadmin:{ADMIN_TOKEN} name=alice\nread:{READ_TOKEN}\n"
        f"executor:{RESIZER_TOKEN} name=resizers worker_prefix=resizer- tasks=resize|thumb groups=gpu"
    )
    alice, reader, resizers = (tokens.identify(t) for t in (ADMIN_TOKEN, READ_TOKEN, RESIZER_TOKEN))
    assert alice is not None and (alice.role, alice.name, alice.by) == (Role.ADMIN, "alice", "api:alice")
    assert reader is not None and reader.name == "read-1"  # unnamed: role and position
    assert resizers is not None and resizers.worker_prefix == "resizer-"
    assert resizers.tasks == frozenset({"resize", "thumb"}) and resizers.groups == frozenset({"gpu"})
    with pytest.raises(InvalidInput, match="item #1"):
        parse_tokens(f"admin:{ADMIN_TOKEN} colour=red")
    from mscheduler.web.auth import Token

    with pytest.raises(InvalidInput, match="name 'x' is taken"):
        ApiTokens(admin=[Token(ADMIN_TOKEN, name="x")], read=[Token(READ_TOKEN, name="x")])
    with pytest.raises(InvalidInput, match="bind executor tokens only"):
        parse_tokens(f"read:{READ_TOKEN} worker_prefix=r-")
    with pytest.raises(InvalidInput, match="tasks"):
        parse_tokens(f"executor:{RESIZER_TOKEN} tasks=bad|na$me")


def test_a_tokens_file_others_may_read_is_warned_about(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"admin:{ADMIN_TOKEN}\n")
    path.chmod(0o644)
    [warning] = read_tokens_file(path).warnings
    assert "may be read by group or others" in warning and "chmod 600" in warning
    path.chmod(0o600)
    assert read_tokens_file(path).warnings == ()


async def test_the_app_logs_the_warnings_at_start(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "mscheduler.web")
    tokens = ApiTokens(admin=[ADMIN_TOKEN], read=["0123456789abcdef"])
    create_app(operations=Operations(MemoryDriver()), tokens=tokens)
    assert any("looks easy to guess" in r.getMessage() for r in caplog.records)
    assert all("0123456789abcdef" not in r.getMessage() for r in caplog.records)


# -- over HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def store() -> MemoryDriver:
    return MemoryDriver(clock=FakeClock(), events=True)


def _client(store: MemoryDriver, tokens: ApiTokens) -> httpx.AsyncClient:
    executors = RemoteExecutors(store, clock=store.clock, max_wait=0)
    app = create_app(operations=Operations(store, clock=store.clock), tokens=tokens, executors=executors)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.fixture
async def http(store: MemoryDriver) -> Any:
    """Named and bound tokens (the format an earlier build refuses)."""
    tokens = parse_tokens(
        f"admin:{ADMIN_TOKEN} name=alice\nread:{READ_TOKEN}\n"
        f"executor:{RESIZER_TOKEN} name=resizers worker_prefix=resizer- tasks=resize groups=gpu\n"
        f"executor:{FREE_EXECUTOR_TOKEN}"
    )
    async with _client(store, tokens) as client:
        yield client


@pytest.fixture
async def plain_http(store: MemoryDriver) -> Any:
    """Unnamed tokens, as an earlier build took them."""
    tokens = ApiTokens(admin=[ADMIN_TOKEN], read=[READ_TOKEN], executor=[FREE_EXECUTOR_TOKEN])
    async with _client(store, tokens) as client:
        yield client


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_operator_actions_record_the_tokens_name(http: httpx.AsyncClient, store: MemoryDriver) -> None:
    await publisher(store).send_many([Task("a", "job", None), Task("b", "job", None)])
    assert (
        await http.post("/api/v1/tasks/a/cancel", json={"reason": "dup"}, headers=_as(ADMIN_TOKEN))
    ).is_success
    assert (await http.post("/api/v1/tasks/b/pause", headers=_as(ADMIN_TOKEN))).is_success
    edit = await http.patch("/api/v1/tasks/b/option", json={"priority": 3}, headers=_as(ADMIN_TOKEN))
    assert edit.is_success
    task = (await http.get("/api/v1/tasks/a", headers=_as(ADMIN_TOKEN))).json()
    assert task["cancelled"]["by"] == "api:alice" and task["cancelled"]["reason"] == "dup"
    kinds = {"kinds": "cancelled,paused,edited"}
    events = (await http.get("/api/v1/events", headers=_as(ADMIN_TOKEN), params=kinds)).json()
    assert [(e["key"], e["kind"], (e["detail"] or {}).get("by")) for e in events["events"]] == [
        ("a", "cancelled", "api:alice"),
        ("b", "paused", "api:alice"),
        ("b", "edited", "api:alice"),  # an edit names its author too (was: no detail)
    ]
    me = (await http.get("/api/v1/whoami", headers=_as(ADMIN_TOKEN))).json()
    assert me == {"role": "admin", "name": "alice"}


async def test_a_bound_executor_token_leases_pings_and_reports_only_as_itself(
    http: httpx.AsyncClient, store: MemoryDriver
) -> None:
    await publisher(store).send_many([Task("r1", "resize", None), Task("o1", "other", None)])
    bound = _as(RESIZER_TOKEN)
    lease = {"worker_id": "resizer-1", "names": ["resize"], "groups": ["gpu"]}
    refused = {
        "worker id": lease | {"worker_id": "thief-1"},
        "name": lease | {"names": ["resize", "other"]},
        "group": lease | {"groups": ["gpu", "cpu"]},
    }
    for why, body in refused.items():
        response = await http.post("/api/v1/executors/lease", json=body, headers=bound)
        assert response.status_code == 403, why
        assert response.json()["error"] == "forbidden" and "this token may" in response.json()["detail"]
    [task] = (await http.post("/api/v1/executors/lease", json=lease, headers=bound)).json()["tasks"]
    assert task["key"] == "r1"

    # another executor token leases "o1"; the bound token cannot ping or report it, even knowing
    # its attempt token: it may only act as resizer-* (and the attempt is fenced by worker id)
    free = _as(FREE_EXECUTOR_TOKEN)
    [other] = (
        await http.post(
            "/api/v1/executors/lease", json={"worker_id": "w-9", "names": ["other"]}, headers=free
        )
    ).json()["tasks"]
    ping = {"worker_id": "w-9", "tasks": [{"key": "o1", "attempt": other["attempt"]}]}
    assert (await http.post("/api/v1/executors/ping", json=ping, headers=bound)).status_code == 403
    report = {"worker_id": "w-9", "key": "o1", "attempt": other["attempt"], "outcome": "succeeded"}
    assert (await http.post("/api/v1/executors/report", json=report, headers=bound)).status_code == 403
    forged = report | {"worker_id": "resizer-1"}
    assert (await http.post("/api/v1/executors/report", json=forged, headers=bound)).status_code == 409
    assert (await Operations(store, clock=store.clock).get_task("o1")).status.value == "running"

    mine = {"worker_id": "resizer-1", "key": "r1", "attempt": task["attempt"], "outcome": "succeeded"}
    assert (await http.post("/api/v1/executors/report", json=mine, headers=bound)).status_code == 200


async def test_attempt_tokens_are_not_shown_to_read_tokens(
    plain_http: httpx.AsyncClient, store: MemoryDriver
) -> None:
    http = plain_http
    ops = Operations(store, clock=store.clock)
    await ops.set_limit("job", max_running=2)
    await publisher(store).send(Task("t1", "job", None))
    free = _as(FREE_EXECUTOR_TOKEN)
    [leased] = (
        await http.post("/api/v1/executors/lease", json={"worker_id": "w-1", "names": ["job"]}, headers=free)
    ).json()["tasks"]
    ping = {
        "worker_id": "w-1",
        "tasks": [{"key": "t1", "attempt": leased["attempt"], "progress": {"fraction": 0.5}}],
    }
    assert (await http.post("/api/v1/executors/ping", json=ping, headers=free)).status_code == 200
    token = leased["attempt"]

    admin, read = _as(ADMIN_TOKEN), _as(READ_TOKEN)
    for path in (
        "/api/v1/tasks/t1",
        "/api/v1/tasks",
        "/api/v1/limits",
        "/api/v1/limits/job",
        "/api/v1/events",
    ):
        assert token in (await http.get(path, headers=admin)).text, path
        shown = await http.get(path, headers=read)
        assert shown.status_code == 200 and token not in shown.text, path
    task = (await http.get("/api/v1/tasks/t1", headers=read)).json()
    assert task["worker_states"][0]["attempt"] == "" and task["progress"]["attempt"] == ""
    assert task["worker_states"][0]["worker_id"] == "w-1"  # the rest is there
    # event ids are opaque to a read token, the same in a listing and in the stream
    listed = (await http.get("/api/v1/events", headers=read, params={"key": "t1"})).json()["events"]
    streamed = await http.get(
        "/api/v1/events/stream",
        headers=read,
        params={"key": "t1", "since": listed[0]["written"], "max_events": len(listed)},
    )
    assert token not in streamed.text
    ids = [json.loads(line[6:])["id"] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert ids == [e["id"] for e in listed]


async def test_an_unnamed_tokens_actions_record_its_role_and_position(
    plain_http: httpx.AsyncClient, store: MemoryDriver
) -> None:
    await publisher(store).send(Task("a", "job", None))
    assert (await plain_http.post("/api/v1/tasks/a/cancel", headers=_as(ADMIN_TOKEN))).is_success
    task = (await plain_http.get("/api/v1/tasks/a", headers=_as(ADMIN_TOKEN))).json()
    assert task["cancelled"]["by"] == "api:admin-1"  # not "api": which token did it
