"""``GET /api/v1/tasks?sort=...``: newest first, by update, attempts...; ``prev_cursor`` pages back;
``with_total`` counts what the filters select; a bad sort is a 422 before any read. And the
CLI's ``tasks ls --sort``."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from mscheduler import MemoryDriver, Operations, Task
from mscheduler.cli import common as cli_ops
from tests.acceptance.support import cli
from tests.web.support import ADMIN, CountingDriver, publisher, tick


async def _seed(driver: CountingDriver, n: int = 9) -> None:
    for i in range(n):
        await publisher(driver).send(Task(f"t{i}", "job" if i % 3 else "other", None))
        tick(driver)
    ops = Operations(driver, clock=driver.clock)
    await ops.cancel("t4")  # updated last
    tick(driver)


async def test_sorted_pages_go_forward_and_back_with_a_total(
    client: httpx.AsyncClient, driver: CountingDriver
) -> None:
    await _seed(driver)
    first = (
        await client.get(
            "/api/v1/tasks", params={"sort": "-created", "limit": 4, "with_total": "true"}, headers=ADMIN
        )
    ).json()
    assert [t["key"] for t in first["tasks"]] == ["t8", "t7", "t6", "t5"]
    assert first["prev_cursor"] is None and (first["total"], first["total_capped"]) == (9, False)
    second = (
        await client.get(
            "/api/v1/tasks",
            params={"sort": "-created", "limit": 4, "cursor": first["next_cursor"]},
            headers=ADMIN,
        )
    ).json()
    assert [t["key"] for t in second["tasks"]] == ["t4", "t3", "t2", "t1"]
    assert "total" not in second or second["total"] is None
    back = (
        await client.get(
            "/api/v1/tasks",
            params={"sort": "-created", "limit": 4, "cursor": second["prev_cursor"]},
            headers=ADMIN,
        )
    ).json()
    assert [t["key"] for t in back["tasks"]] == ["t8", "t7", "t6", "t5"] and back["prev_cursor"] is None
    updated = (
        await client.get("/api/v1/tasks", params={"sort": "-updated", "limit": 1}, headers=ADMIN)
    ).json()
    assert [t["key"] for t in updated["tasks"]] == ["t4"]
    named = (
        await client.get(
            "/api/v1/tasks", params={"sort": "name", "name": "other", "with_total": "true"}, headers=ADMIN
        )
    ).json()
    assert [t["key"] for t in named["tasks"]] == ["t0", "t3", "t6"] and named["total"] == 3


@pytest.mark.parametrize("sort", ["priority", "--created", "created;drop", "-"])
async def test_a_bad_sort_is_refused_before_any_read(
    client: httpx.AsyncClient, driver: CountingDriver, sort: str
) -> None:
    driver.calls.clear()
    response = await client.get("/api/v1/tasks", params={"sort": sort}, headers=ADMIN)
    assert response.status_code == 422 and "sort" in response.json()["detail"]
    assert sum(driver.calls.values()) == 0
    prefixed = await client.get(
        "/api/v1/tasks", params={"sort": "-updated", "key_prefix": "t"}, headers=ADMIN
    )
    assert prefixed.status_code == 422 and "key order" in prefixed.json()["detail"]


def test_the_cli_lists_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = MemoryDriver()

    async def seed() -> None:
        from mscheduler import Publisher

        for i in range(3):
            await Publisher(driver).send(Task(f"k{i}", "job", None))
            await asyncio.sleep(0.002)

    asyncio.run(seed())
    monkeypatch.setattr(cli_ops, "operations_override", lambda: Operations(driver))
    code, out, err = cli("tasks", "ls", "--sort=-created", "--json")
    assert code == 0, err
    import json

    assert [t["key"] for t in json.loads(out)] == ["k2", "k1", "k0"]
    code, _, err = cli("tasks", "ls", "--sort", "sideways")
    assert code == 2 and "sort" in err
