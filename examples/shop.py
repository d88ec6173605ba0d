"""A small shop's background work, defined apart from any store: the same ``app`` runs with no
database and with MongoDB::

    mscheduler dev examples.shop:app                   # in memory, with the API and the dashboard
    mscheduler worker examples.shop:app --mongodb-uri 'mongodb://localhost:27017/?replicaSet=rs0'

Send it work from another terminal (``dev`` prints the address and the token)::

    mscheduler tasks send send_invoice --key invoice-42 \\
        --params '{"order_id": 42, "email": "ada@example.com"}' --api-url URL --token TOKEN
    curl -H "Authorization: Bearer TOKEN" -H 'Content-Type: application/json' \\
        -d '{"key": "receipt-42", "name": "render_receipt", "params": {"order_id": 42, "lines": 3}}' \\
        URL/api/v1/tasks

Four kinds of handler: an ``async def`` (on the event loop), a plain function (in a thread: it may
block), CPU-bound work in a process, and one that asks to be retried; a plan runs a report
every minute. A workflow fulfils an order: reserve its lines, pack each line (one task per line,
at once), then ship with every packed parcel: ``await publisher.send(fulfil(7, lines=3))``, or
``POST /api/v1/tasks`` with the same task as JSON (its ``children`` with ``needs`` / ``map_over``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from pydantic import BaseModel

from mscheduler import (
    App,
    Child,
    EverySchedule,
    Plan,
    PlanTiming,
    Retry,
    SyncTaskContext,
    Task,
    TaskContext,
)

app = App("shop")


class Invoice(BaseModel):
    order_id: int
    email: str


class Receipt(BaseModel):
    order_id: int
    lines: int = 1


@app.handler("send_invoice")
async def send_invoice(params: Invoice, ctx: TaskContext) -> dict[str, object]:
    """Async I/O work runs on the event loop."""
    return {"sent_to": params.email, "order_id": params.order_id, "attempt": ctx.attempt_no}


@app.handler("render_receipt")
def render_receipt(params: Receipt, ctx: SyncTaskContext) -> str:
    """A plain function runs in the consumer's thread pool: blocking calls are fine here. It polls
    ``ctx.cancelled`` (a thread cannot be stopped from outside) and reports progress."""
    for line in range(1, params.lines + 1):
        if ctx.cancelled:
            return "given up"
        time.sleep(0.05)  # stands for a blocking call (a PDF library, a file, a socket)
        ctx.progress(line / params.lines, f"line {line} of {params.lines}")
    return f"receipt-{params.order_id}.pdf"


def price_report(params: dict[str, int]) -> dict[str, int]:
    """CPU-bound work runs in a process of the pool (params and result are pickled)."""
    n = int((params or {}).get("n", 200_000))
    return {"n": n, "sum_of_squares": sum(i * i for i in range(n))}


app.register("price_report", price_report, run_in="process")


@app.handler("charge_card")
async def charge_card(params: dict[str, object], ctx: TaskContext) -> str:
    """The payment gateway is 'busy' on the first try: the task is retried two seconds later."""
    if ctx.attempt_no == 1:
        raise Retry(after=2, reason="gateway busy")
    return "charged"


@app.handler("reserve")
async def reserve(params: dict[str, int], ctx: TaskContext) -> list[dict[str, int]]:
    """Reserve each line of the order; the list is what ``pack`` maps over."""
    return [{"order_id": params["order_id"], "line": n} for n in range(params["lines"])]


@app.handler("pack")
async def pack(line: dict[str, int]) -> str:
    return f"parcel-{line['order_id']}-{line['line']}"


@app.handler("ship")
async def ship(params: dict[str, int], ctx: TaskContext) -> str:
    parcels = ctx.results["pack"]  # every packed parcel, in the order of the lines
    return f"order {params['order_id']} shipped in {len(parcels)} parcels: {', '.join(parcels)}"


def fulfil(order_id: int, lines: int) -> Task:
    """The workflow of one order: reserve, then pack each line at once, then ship."""
    steps = [Child("reserve"), Child("pack", map_over="reserve"), Child("ship", needs=["pack"])]
    return Task(f"order-{order_id}", "fulfil", {"order_id": order_id, "lines": lines}, children=steps)


app.consumer(concurrency=8)

app.plan(
    Plan(
        plan_id="price-report-every-minute",
        name="price_report",
        params={"n": 100_000},
        timing=PlanTiming(schedule=EverySchedule(interval=60, start=datetime(2026, 1, 1, tzinfo=UTC))),
    )
)
