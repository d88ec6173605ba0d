"""Sends checked at the door: ``POST /api/v1/tasks`` (``Operations.send``, what the CLI calls
too) refuses a name no live worker handles, naming the handled ones, unless the caller says it
is expected (``allow_unknown``), and params that the JSON schema the handler's workers publish
refuses, with the path of the field at fault; nothing is written. ``GET /api/v1/handlers``
lists the names and their schemas."""

from __future__ import annotations

from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel, Field

from mscheduler import App, Consumer, InvalidInput, MemoryDriver, Operations, Publisher, Task, TaskContext
from mscheduler.testing.clock import FakeClock
from mscheduler.web import ApiTokens, create_app
from tests.web.support import ADMIN, ADMIN_TOKEN, CountingDriver, live_worker, tick

TASKS = "/api/v1/tasks"
PUBLISH_TOKEN = "publish-token-0123456789abcdef"
PUBLISH = {"Authorization": f"Bearer {PUBLISH_TOKEN}"}


class Line(BaseModel):
    sku: str = Field(min_length=1)
    qty: int = Field(ge=1)


class Invoice(BaseModel):
    order_id: int
    email: str
    lines: list[Line] = []
    speed: Literal["slow", "fast"] = "slow"
    note: str | None = None


@pytest.fixture
async def client(operations: Operations) -> Any:
    tokens = ApiTokens(admin=[ADMIN_TOKEN], publish=[PUBLISH_TOKEN])
    app = create_app(operations=operations, tokens=tokens)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        yield http


async def test_an_unknown_name_is_refused_naming_the_handled_ones(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await live_worker(driver, "send_invoice", "render_pdf")
    answer = await client.post(TASKS, json={"key": "k", "name": "send_invoce"}, headers=PUBLISH)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["error"] == "invalid_input" and body["field"] == "name"
    assert "no live worker handles tasks named 'send_invoce'" in body["detail"]
    assert "render_pdf, send_invoice" in body["detail"] and "allow_unknown" in body["detail"]
    assert await driver.count_by_status() == {}
    expected = await client.post(
        TASKS, params={"allow_unknown": "true"}, json={"key": "k", "name": "send_invoce"}, headers=PUBLISH
    )
    assert expected.status_code == 201 and expected.json() == {"key": "k", "created": True}


async def test_with_no_worker_at_all_the_refusal_says_so(client: httpx.AsyncClient) -> None:
    answer = await client.post(TASKS, json={"tasks": [{"key": "k", "name": "job"}]}, headers=ADMIN)
    assert answer.status_code == 422 and "(no worker is running)" in answer.json()["detail"]


async def test_a_worker_stopped_or_silent_handles_nothing(
    client: httpx.AsyncClient, driver: CountingDriver, operations: Operations
) -> None:
    await live_worker(driver, "job", worker_id="w-stopped")
    await driver.unregister_worker("w-stopped", driver.clock.now())
    await live_worker(driver, "other", worker_id="w-silent")
    tick(driver, 31_000)  # its last heartbeat is older than 30 s
    answer = await client.post(TASKS, json={"key": "k", "name": "job"}, headers=ADMIN)
    assert answer.status_code == 422 and "(no worker is running)" in answer.json()["detail"]
    assert await operations.list_handlers() == []


@pytest.mark.parametrize(
    ("params", "field", "says"),
    [
        ({"order_id": "abc", "email": "a@b.c"}, "params.order_id", 'expected an integer, got string "abc"'),
        ({"email": "a@b.c"}, "params.order_id", "a required field is missing"),
        (
            {"order_id": 1, "email": "a@b.c", "lines": [{"sku": "x", "qty": 0}]},
            "params.lines.0.qty",
            "at least 1",
        ),
        (
            {"order_id": 1, "email": "a@b.c", "lines": [{"sku": "", "qty": 1}]},
            "params.lines.0.sku",
            "at least 1",
        ),
        ({"order_id": 1, "email": "a@b.c", "speed": "warp"}, "params.speed", 'one of "slow", "fast"'),
        ({"order_id": 1, "email": "a@b.c", "note": 5}, "params.note", "none of the allowed forms"),
        ([1, 2], "params", "expected an object, got array"),
    ],
)
async def test_params_the_schema_refuses_are_a_422_naming_the_field(
    client: httpx.AsyncClient, driver: CountingDriver, params: Any, field: str, says: str
) -> None:
    await live_worker(driver, models={"send_invoice": Invoice})
    answer = await client.post(
        TASKS, json={"key": "i-1", "name": "send_invoice", "params": params}, headers=PUBLISH
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field and says in answer.json()["detail"], answer.json()
    assert answer.json()["detail"].startswith(f"invalid params for 'send_invoice': {field}: ")
    assert await driver.count_by_status() == {}


async def test_params_that_fit_are_sent_and_a_bad_one_refuses_the_whole_batch(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await live_worker(driver, "plain", models={"send_invoice": Invoice})
    good = {"key": "i-1", "name": "send_invoice", "params": {"order_id": 7, "email": "a@b.c", "note": None}}
    plain = {"key": "p-1", "name": "plain", "params": {"anything": ["goes"]}}  # no model: no check
    bad = {"key": "i-2", "name": "send_invoice", "params": {"order_id": 7.5, "email": "a@b.c"}}
    refused = await client.post(TASKS, json={"tasks": [good, plain, bad]}, headers=ADMIN)
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith(
        "task 'i-2': invalid params for 'send_invoice': params.order_id"
    )
    assert await driver.count_by_status() == {}
    sent = await client.post(TASKS, json={"tasks": [good, plain]}, headers=ADMIN)
    assert sent.status_code == 201 and [t["created"] for t in sent.json()["tasks"]] == [True, True]


async def test_children_are_checked_by_their_own_names(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await live_worker(driver, "fetch")
    family = {"key": "f", "name": "family", "children": ["fetch", "store"]}
    answer = await client.post(TASKS, json=family, headers=ADMIN)
    assert answer.status_code == 422 and "named 'store'" in answer.json()["detail"]
    await live_worker(driver, "store", worker_id="w-2")
    assert (await client.post(TASKS, json=family, headers=ADMIN)).status_code == 201


async def test_any_live_workers_schema_may_accept_during_a_rolling_deploy(
    client: httpx.AsyncClient, driver: CountingDriver, operations: Operations
) -> None:
    class InvoiceV2(BaseModel):
        order_id: str  # the new version takes text ids

    await live_worker(driver, worker_id="w-old", models={"send_invoice": Invoice})
    tick(driver)
    await live_worker(driver, worker_id="w-new", models={"send_invoice": InvoiceV2})
    for key, params in (("old", {"order_id": 1, "email": "a@b.c"}), ("new", {"order_id": "A-1"})):
        answer = await client.post(
            TASKS, json={"key": key, "name": "send_invoice", "params": params}, headers=ADMIN
        )
        assert answer.status_code == 201, answer.text
    [handler] = await operations.list_handlers()
    assert handler.workers == 2 and handler.params_schema == InvoiceV2.model_json_schema()  # the newest


async def test_the_handlers_route_lists_names_and_schemas(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await live_worker(driver, "plain", models={"send_invoice": Invoice})
    await live_worker(driver, "plain", worker_id="w-2")
    answer = await client.get("/api/v1/handlers", headers=PUBLISH)  # a publish token may ask
    assert answer.status_code == 200, answer.text
    assert answer.json() == [
        {"name": "plain", "workers": 2, "params_schema": None},
        {"name": "send_invoice", "workers": 1, "params_schema": Invoice.model_json_schema()},
    ]


async def test_a_starting_consumer_publishes_its_handlers_schemas() -> None:
    """What ``live_worker`` stands for in the tests above: a real consumer's registration."""
    clock = FakeClock()
    driver = MemoryDriver(clock=clock)
    app = App("shop")

    @app.handler("send_invoice")
    async def send_invoice(params: Invoice, ctx: TaskContext) -> None: ...

    @app.handler("loose")
    def loose(params: dict[str, Any]) -> None: ...

    operations = Operations(driver, clock=clock)
    [consumer] = app.consumers(driver, clock=clock)
    async with consumer:
        handlers = {h.name: h for h in await operations.list_handlers()}
        assert handlers["send_invoice"].params_schema == Invoice.model_json_schema()
        assert handlers["loose"].params_schema is None
        with pytest.raises(InvalidInput, match=r"params\.email: a required field is missing") as refused:
            await operations.send(Task("i", "send_invoice", {"order_id": 1}))
        assert refused.value.field == "params.email"
        assert await operations.send(Task("i", "send_invoice", {"order_id": 1, "email": "a@b.c"}))
    assert isinstance(consumer, Consumer)


async def test_the_publisher_still_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    """A ``Publisher`` in the application's own code is not checked at the door: it warns once
    per name no live worker handles (its tasks wait), and stores the task."""
    driver = MemoryDriver()
    assert await Publisher(driver).send(Task("k", "nobody_handles_this", {"x": 1}))
    assert "no live worker handles tasks named 'nobody_handles_this'" in caplog.text
