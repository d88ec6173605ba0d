"""A 10,000-item fan-out (memory driver): every item runs once, the join gets all 10,000 results
in order, and no document grows with the items: the map step and the workflow stay a few hundred
bytes (a map step keeps a count and the set of statuses among its items, never a list of them)."""

from __future__ import annotations

import bson

from mscheduler import App, Child, Task, TaskContext
from mscheduler.testing import scheduler_kit

ITEMS = 10_000


async def test_a_10000_item_fan_out_stays_within_document_limits() -> None:
    app = App()
    ran: list[int] = []

    @app.handler("list")
    async def listing(params: object, ctx: TaskContext) -> list[int]:
        return list(range(ITEMS))

    @app.handler("item")
    async def item(n: int) -> int:
        ran.append(n)
        return n % 7

    @app.handler("join")
    async def join(params: object, ctx: TaskContext) -> list[int]:
        results = ctx.results["item"]
        return [len(results), sum(results), results[0], results[-1]]

    app.consumer(concurrency=64)
    steps = [Child("list"), Child("item", map_over="list"), Child("join", needs=["item"])]
    async with scheduler_kit(app) as kit:
        await kit.publisher.send(Task("big", "big", children=steps))
        assert await kit.publisher.wait("big") == [
            ITEMS,
            sum(n % 7 for n in range(ITEMS)),
            0,
            (ITEMS - 1) % 7,
        ]
        assert sorted(ran) == list(range(ITEMS))  # each item once
        step = await kit.driver.get_task("big/item")
        workflow = await kit.driver.get_task("big")
        assert step is not None and workflow is not None
        assert step["children"]["count"] == ITEMS and step["state"]["children"] == [{"status": "succeeded"}]
        assert len(bson.encode(step)) < 2_000 and len(bson.encode(workflow)) < 2_000
        graph = await kit.operations.workflow("big")
        assert graph.steps[1].item_statuses == {"succeeded": ITEMS}
