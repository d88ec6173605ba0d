"""The example app's workflow (examples/shop.py): an order reserved, packed line by line and
shipped with every parcel, in order."""

from __future__ import annotations

from examples.shop import app, fulfil
from mscheduler import TaskStatus
from mscheduler.testing import scheduler_kit


async def test_the_shop_fulfils_an_order_through_its_workflow() -> None:
    async with scheduler_kit(app) as kit:
        assert await kit.publisher.send(fulfil(7, lines=3))
        shipped = await kit.publisher.wait("order-7")
        assert shipped == "order 7 shipped in 3 parcels: parcel-7-0, parcel-7-1, parcel-7-2"
        graph = await kit.operations.workflow("order-7")
        assert [(s.name, s.status) for s in graph.steps] == [
            ("reserve", TaskStatus.SUCCEEDED),
            ("pack", TaskStatus.SUCCEEDED),
            ("ship", TaskStatus.SUCCEEDED),
        ]
        assert graph.steps[1].items == 3 and graph.steps[1].item_statuses == {"succeeded": 3}
