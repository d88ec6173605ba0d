"""The dashboard's "new task" form in headless chromium: built from the JSON schema a live
worker publishes for the handler's params (a number, text, a list of choices, a checkbox, JSON
for a list of objects), sent to ``POST /api/v1/tasks``; a field the API refuses at the door is
marked where it is; the task is stored with typed params. Admins only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from mscheduler.drivers.base import WorkerInfo
from mscheduler.runtime.consumer.handlers import params_schema_text
from tests.browser.conftest import DashboardServer
from tests.browser.support import login, open_hash, shot
from tests.web.support import ADMIN_TOKEN, READ_TOKEN

pytestmark = pytest.mark.browser

NAME = "form_invoice"


class Line(BaseModel):
    sku: str = Field(min_length=1)
    qty: int = Field(ge=1)


class Invoice(BaseModel):
    order_id: int = Field(description="the order to bill")
    email: str
    speed: Literal["slow", "fast"] = "slow"
    rush: bool = False
    note: str | None = None
    lines: list[Line] = []


def publish_schema(dashboard: DashboardServer) -> None:
    schema = params_schema_text(Invoice)
    assert schema is not None
    info = WorkerInfo("form-worker", "h", 1, [NAME], 1, datetime.now(UTC), schemas=[(NAME, schema)])
    dashboard.run(dashboard.driver.register_worker(info))


def test_the_form_is_built_from_the_schema_and_sends_typed_params(
    page: Any, dashboard: DashboardServer
) -> None:
    publish_schema(dashboard)
    login(page, dashboard, ADMIN_TOKEN)
    open_hash(page, "#/tasks", "#task-table")
    page.locator("#new-task").click()
    page.locator("#send-form").wait_for()
    page.locator("#send-name").select_option(NAME)
    page.locator("#param-order_id").wait_for()
    assert page.locator("#param-order_id").get_attribute("type") == "number"
    assert page.locator("#param-order_id").get_attribute("step") == "1"
    assert page.locator("#param-email").get_attribute("type") == "text"
    assert page.locator("#param-speed option").all_inner_texts() == ["(default)", "slow", "fast"]
    assert page.locator("#param-rush").get_attribute("type") == "checkbox"
    assert page.locator("textarea#param-lines").count() == 1
    assert "the order to bill" in page.locator('[data-field="params.order_id"]').inner_text()

    page.locator("#send-key").fill("form-1")
    page.locator("#param-order_id").fill("42")
    page.locator("#param-email").fill("ada@example.com")
    page.locator("#param-speed").select_option("fast")
    page.locator("#param-rush").check()
    page.locator("#param-lines").fill('[{"sku": "", "qty": 2}]')
    page.locator("#send-submit").click()
    refusal = page.locator('[data-field="params.lines"] .field-error')
    refusal.wait_for()
    assert "params.lines.0.sku" in refusal.inner_text() and "at least 1 character" in refusal.inner_text()
    assert dashboard.run(dashboard.operations.count_tasks(key_prefix="form-")).count == 0
    shot(page, "dashboard-new-task-refused-1400")

    page.locator("#param-lines").fill('[{"sku": "A-7", "qty": 2}]')
    page.locator("#send-submit").click()
    page.locator("#task-page, h1").first.wait_for()
    page.wait_for_function("location.hash.startsWith('#/task/form-1')")
    info = dashboard.run(dashboard.operations.get_task("form-1"))
    assert info.name == NAME
    assert info.params == {
        "order_id": 42,
        "email": "ada@example.com",
        "speed": "fast",
        "rush": True,
        "note": None,
        "lines": [{"sku": "A-7", "qty": 2}],
    }
    assert "Sent task form-1." in page.locator("#banner").inner_text()


def test_a_read_token_gets_no_form(page: Any, dashboard: DashboardServer) -> None:
    publish_schema(dashboard)
    login(page, dashboard, READ_TOKEN)
    open_hash(page, "#/tasks", "#task-table")
    assert page.locator("#new-task").count() == 0
    open_hash(page, "#/new", "main .panel")
    assert page.locator("#send-form").count() == 0
    assert "needs an admin token" in page.locator("main").inner_text()
