"""Workflows over the REST API: a workflow sent as JSON (children with ``needs`` / ``map_over``),
a cycle refused with nothing written, ``GET /api/v1/workflows/{key}`` (the graph) and
``POST .../restart-step`` (409 while the step is pending; read tokens may not)."""

from __future__ import annotations

import httpx

from mscheduler import Operations
from tests.web.support import ADMIN, READ

WORKFLOW = {
    "key": "wf-1",
    "name": "album",
    "children": [
        {"name": "list_images"},
        {"name": "resize", "map_over": "list_images", "max_items": 50, "on_failure": "continue"},
        {"name": "publish", "needs": ["resize"]},
    ],
}
# no worker runs in these tests: the door would refuse the step names
NO_WORKER = {"allow_unknown": "true"}


async def test_a_workflow_sent_as_json_is_shown_as_a_graph(
    client: httpx.AsyncClient, operations: Operations
) -> None:
    sent = await client.post("/api/v1/tasks", json=WORKFLOW, params=NO_WORKER, headers=ADMIN)
    assert sent.status_code == 201, sent.text
    graph = await client.get("/api/v1/workflows/wf-1", headers=READ)
    assert graph.status_code == 200, graph.text
    body = graph.json()
    assert body["mode"] == "graph" and body["final"] == ["publish"]
    assert [(s["name"], s["needs"], s["map_over"], s["status"]) for s in body["steps"]] == [
        ("list_images", [], None, "pending"),
        ("resize", ["list_images"], "list_images", "pending"),
        ("publish", ["resize"], None, "pending"),
    ]
    assert (await operations.get_task("wf-1/publish")).blocked


async def test_a_cycle_is_refused_and_nothing_is_written(
    client: httpx.AsyncClient, operations: Operations
) -> None:
    body = {
        "key": "loop",
        "name": "x",
        "children": [{"name": "a", "needs": ["b"]}, {"name": "b", "needs": ["a"]}],
    }
    answer = await client.post("/api/v1/tasks", json=body, headers=ADMIN)
    assert answer.status_code == 422 and "cycle" in answer.text
    assert await operations.list_tasks(key_prefix="loop") == []


async def test_restart_step_is_refused_while_pending_and_for_a_read_token(client: httpx.AsyncClient) -> None:
    await client.post("/api/v1/tasks", json=WORKFLOW, params=NO_WORKER, headers=ADMIN)
    url = "/api/v1/workflows/wf-1/restart-step"
    refused = await client.post(url, params={"step": "list_images"}, headers=ADMIN)
    assert refused.status_code == 409 and "pending" in refused.text
    assert (await client.post(url, params={"step": "list_images"}, headers=READ)).status_code == 403
    assert (await client.get("/api/v1/workflows/nope", headers=READ)).status_code == 404
    assert (await client.post(url, params={"step": "nope"}, headers=ADMIN)).status_code == 422
