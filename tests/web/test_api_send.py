"""``POST /api/v1/tasks``: one task or a batch, idempotent by key like ``Publisher.send`` /
``send_many`` (the same code: ``mscheduler.publishing``), 201 / 200 with ``created`` flags, the
same refusals (size cap, a key twice, a bad option) with nothing written, for admin and publish
tokens only."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mscheduler import InvalidInput, Operations, Publisher, Task, TaskStatus
from mscheduler.drivers.base import ClaimParams, FinishParams
from mscheduler.web import ApiTokens, Token, create_app
from tests.web.support import ADMIN, ADMIN_TOKEN, READ, READ_TOKEN, CountingDriver, live_worker

TASKS = "/api/v1/tasks"
PUBLISH_TOKEN = "publish-token-0123456789abcdef"
RESETTER_TOKEN = "publish-may-reset-0123456789abcdef"
EXECUTOR_TOKEN = "executor-token-0123456789abcdef"
PUBLISH = {"Authorization": f"Bearer {PUBLISH_TOKEN}"}
RESETTER = {"Authorization": f"Bearer {RESETTER_TOKEN}"}
EXECUTOR = {"Authorization": f"Bearer {EXECUTOR_TOKEN}"}


@pytest.fixture(autouse=True)
async def handled(driver: CountingDriver) -> None:
    """A live worker handles the names these tests send (a send is checked at the door)."""
    await live_worker(driver, "job", "send_invoice")


@pytest.fixture
async def client(operations: Operations) -> Any:
    tokens = ApiTokens(
        admin=[ADMIN_TOKEN],
        read=[READ_TOKEN],
        publish=[PUBLISH_TOKEN, Token(RESETTER_TOKEN, name="resetter", may=("reset",))],
        executor=[EXECUTOR_TOKEN],
    )
    app = create_app(operations=operations, tokens=tokens)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        yield http


async def test_one_task_is_created_then_left_alone(client: httpx.AsyncClient, operations: Operations) -> None:
    body = {"key": "inv-1", "name": "send_invoice", "params": {"order": 42}, "option": {"priority": 5}}
    first = await client.post(TASKS, json=body, headers=PUBLISH)
    assert first.status_code == 201, first.text
    assert first.json() == {"key": "inv-1", "created": True}
    info = await operations.get_task("inv-1")
    assert (info.name, info.params, info.option.priority) == ("send_invoice", {"order": 42}, 5)

    again = await client.post(TASKS, json=body | {"params": {"order": 43}}, headers=ADMIN)
    assert again.status_code == 200 and again.json() == {"key": "inv-1", "created": False}
    assert (await operations.get_task("inv-1")).params == {"order": 42}  # as Publisher.send: untouched


async def test_a_batch_reports_each_key_and_matches_send_many(
    client: httpx.AsyncClient, operations: Operations, driver: CountingDriver
) -> None:
    await Publisher(driver, clock=driver.clock).send(Task("b-2", "job", {}))
    tasks = [{"key": f"b-{i}", "name": "job", "params": {"i": i}} for i in range(4)]
    answer = await client.post(TASKS, json={"tasks": tasks}, headers=PUBLISH)
    assert answer.status_code == 201, answer.text
    assert answer.json() == {
        "tasks": [
            {"key": "b-0", "created": True},
            {"key": "b-1", "created": True},
            {"key": "b-2", "created": False},
            {"key": "b-3", "created": True},
        ]
    }
    none_new = await client.post(TASKS, json={"tasks": tasks[:2]}, headers=PUBLISH)
    assert none_new.status_code == 200
    assert [t["created"] for t in none_new.json()["tasks"]] == [False, False]


async def test_reset_finished_resets_an_ended_task(
    client: httpx.AsyncClient, operations: Operations, driver: CountingDriver
) -> None:
    await operations.send(Task("r-1", "job", {"v": 1}))
    now = driver.clock.now()
    [claimed] = await driver.claim(ClaimParams("w1", ["job"], now, ["a-1"]))
    error = {"type": "Fail", "message": "no", "traceback": None}
    await driver.finish([FinishParams("r-1", "w1", claimed.attempt, now, "failed", None, error, None, True)])
    assert (await operations.get_task("r-1")).status is TaskStatus.FAILED
    body = {"key": "r-1", "name": "job", "params": {"v": 2}}
    # a plain publish token sends new tasks only: re-running and rewriting a finished one is more
    refused = await client.post(TASKS, params={"reset_finished": "true"}, json=body, headers=PUBLISH)
    assert refused.status_code == 403 and "may=reset" in refused.json()["detail"]
    assert (await operations.get_task("r-1")).params == {"v": 1}
    answer = await client.post(TASKS, params={"reset_finished": "true"}, json=body, headers=RESETTER)
    assert answer.status_code == 201 and answer.json()["created"] is True
    info = await operations.get_task("r-1")
    assert info.status is TaskStatus.PENDING and info.params == {"v": 2}
    # the earlier attempt is kept in the history, with who reset it; the sent event names them
    stored = await driver.get_task("r-1")
    assert stored is not None
    history = stored["state"]["history"]
    assert [(h["action"], h["by"], [e["attempt"] for e in h["worker_states"]]) for h in history] == [
        ("reset", "api:resetter", [claimed.attempt])
    ]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"key": "big", "name": "job", "params": {"blob": "x" * (600 * 1024)}}, "max_params_bytes"),
        ({"tasks": [{"key": "d", "name": "job"}, {"key": "d", "name": "job"}]}, "the key 'd' twice"),
        ({"key": "bad", "name": "job", "option": {"priority": 10**9}}, "priority"),
        ({"key": "", "name": "job"}, "key"),
        ({"key": "x", "name": "job", "$where": "1"}, "where"),
        ({"tasks": []}, "tasks"),
        (
            {"tasks": [{"key": "ok", "name": "job"}, {"key": "big", "name": "job", "params": "y" * 600_000}]},
            "big",
        ),
    ],
)
async def test_refused_input_writes_nothing(
    client: httpx.AsyncClient, driver: CountingDriver, body: dict[str, Any], says: str
) -> None:
    answer = await client.post(TASKS, json=body, headers=ADMIN)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid_input" and says in answer.json()["detail"]
    assert await driver.count_by_status() == {}


async def test_the_api_refuses_what_the_publisher_refuses() -> None:
    """One rule: the cap and the duplicate-key check come from the same code for both."""
    ops = Operations(CountingDriver(), max_params_bytes=100)
    publisher = Publisher(ops.driver, max_params_bytes=100)
    big = Task("big", "job", {"blob": "x" * 200})
    for send in (ops.send, publisher.send):
        with pytest.raises(InvalidInput) as refused:
            await send(big)
        assert "params are 2" in str(refused.value) and "max_params_bytes (100)" in str(refused.value)
    twice = [Task("t", "job"), Task("t", "job")]
    for send_many in (ops.send_many, publisher.send_many):
        with pytest.raises(InvalidInput, match="the key 't' twice"):
            await send_many(twice)
    assert await ops.driver.count_by_status() == {}


@pytest.mark.parametrize("headers", [READ, EXECUTOR])
async def test_read_and_executor_tokens_may_not_send(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    answer = await client.post(TASKS, json={"key": "k", "name": "job"}, headers=headers)
    assert answer.status_code == 403


async def test_a_publish_token_may_send_and_nothing_else(client: httpx.AsyncClient) -> None:
    me = (await client.get("/api/v1/whoami", headers=PUBLISH)).json()
    assert me == {"role": "publish", "name": "publish-1"}
    for method, path in (
        ("GET", TASKS),
        ("GET", f"{TASKS}/k"),
        ("POST", f"{TASKS}/k/cancel"),
        ("GET", "/api/v1/stats"),
    ):
        answer = await client.request(method, path, headers=PUBLISH)
        assert answer.status_code == 403, (method, path)
        assert "publish token may only send tasks" in answer.json()["detail"]
    assert (await client.post(TASKS, json={"key": "k", "name": "job"})).status_code == 401


def test_publish_tokens_come_from_the_configuration() -> None:
    from mscheduler.web import Role, parse_tokens

    tokens = parse_tokens(f"admin:{ADMIN_TOKEN}\npublish:{PUBLISH_TOKEN}")
    assert tokens.role_of(PUBLISH_TOKEN) is Role.PUBLISH and tokens.role_of(ADMIN_TOKEN) is Role.ADMIN
    assert "publish=1 token(s)" in repr(tokens)
