"""Flow limits over the REST API: thin routes over ``Operations.set_limit`` / ``get_limit`` /
``list_limits`` / ``remove_limit``; reads for a read token, changes for an admin token; an unknown
limit is a 404 and a bad value a 422 with nothing written."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mscheduler import Operations
from tests.web.support import ADMIN, READ

LIMITS = "/api/v1/limits"


async def test_set_show_list_and_remove_a_limit(client: httpx.AsyncClient, operations: Operations) -> None:
    response = await client.put(
        f"{LIMITS}/partner_api", json={"names": ["fetch", "push"], "rate": "10/s"}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body | {"update_time": None} == {
        "key": "partner_api",
        "names": ["fetch", "push"],
        "max_running": None,
        "rate": "10/1000ms",
        "rate_n": 10,
        "rate_period_seconds": 1.0,
        "running": 0,
        "recent_starts": 0,
        "holders": [],
        "update_time": None,
    }
    assert (await operations.get_limit("partner_api")).limit.names == ("fetch", "push")

    replaced = await client.put(f"{LIMITS}/import", json={"max_running": 4}, headers=ADMIN)
    assert replaced.json()["names"] == ["import"] and replaced.json()["max_running"] == 4
    again = await client.put(f"{LIMITS}/import", json={"max_running": 2, "rate": body["rate"]}, headers=ADMIN)
    assert (again.json()["max_running"], again.json()["rate_n"]) == (2, 10)

    listed = await client.get(LIMITS, headers=READ)
    assert [limit["key"] for limit in listed.json()] == ["import", "partner_api"]
    shown = await client.get(f"{LIMITS}/import", headers=READ)
    assert shown.status_code == 200 and shown.json()["max_running"] == 2

    assert (await client.delete(f"{LIMITS}/import", headers=ADMIN)).status_code == 204
    assert [info.limit.key for info in await operations.list_limits()] == ["partner_api"]


async def test_unknown_limits_are_404(client: httpx.AsyncClient) -> None:
    for response in (
        await client.get(f"{LIMITS}/nope", headers=READ),
        await client.delete(f"{LIMITS}/nope", headers=ADMIN),
    ):
        assert response.status_code == 404
        assert response.json() == {"error": "not_found", "detail": "no limit with key 'nope'"}


async def test_a_read_token_may_not_change_limits(client: httpx.AsyncClient, operations: Operations) -> None:
    await operations.set_limit("import", max_running=1)
    assert (await client.put(f"{LIMITS}/import", json={"max_running": 9}, headers=READ)).status_code == 403
    assert (await client.delete(f"{LIMITS}/import", headers=READ)).status_code == 403
    assert (await operations.get_limit("import")).limit.max_running == 1


@pytest.mark.parametrize(
    ("key", "body"),
    [
        ("import", {}),  # neither max_running nor rate
        ("import", {"max_running": -1}),
        ("import", {"max_running": "3"}),
        ("import", {"max_running": True}),
        ("import", {"rate": "fast"}),
        ("import", {"rate": "0/s"}),
        ("import", {"rate": "10/8d"}),
        ("import", {"names": [], "max_running": 1}),
        ("import", {"names": ["a", "a"], "max_running": 1}),
        ("import", {"names": ["$where"], "max_running": 1}),
        ("import", {"names": "import", "max_running": 1}),
        ("import", {"max_running": 1, "$set": 1}),
        ("$bad", {"max_running": 1}),
        ("other", {"names": ["taken"], "max_running": 1}),  # "taken" is the held limit's
    ],
)
async def test_bad_values_are_422_and_nothing_is_written(
    client: httpx.AsyncClient, operations: Operations, key: str, body: dict[str, Any]
) -> None:
    await operations.set_limit("held", names=["taken"], max_running=1)
    before = await operations.list_limits()
    response = await client.put(f"{LIMITS}/{key}", json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"
    assert await operations.list_limits() == before
    assert (await client.get(f"{LIMITS}/$bad", headers=READ)).status_code == 422
