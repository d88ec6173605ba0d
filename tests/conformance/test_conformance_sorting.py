"""Sorted listings on every driver (issue 20): by created, updated, finished, status, name,
attempts and key, up and down, alone and with filters, paged forward with ``next_cursor`` and
back with ``prev_cursor`` — every task once, in the order the definitions say
(``mscheduler.domain.listing.ORDER_FIELDS``), the same on the memory driver and on Mongo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import TaskInfo
from mscheduler.operations import Operations
from tests.conformance.support import NAME, Store

ORDERS: dict[str, Callable[[TaskInfo], tuple[Any, ...]]] = {
    "created": lambda t: (t.create_time, t.key),
    "updated": lambda t: (t.update_time, t.key),
    "finished": lambda t: (t.finish_time, t.key),
    "status": lambda t: (t.status.value, t.create_time, t.key),
    "name": lambda t: (t.name, t.status.value, t.create_time, t.key),
    "attempts": lambda t: (t.attempts, t.create_time, t.key),
    "key": lambda t: (t.key,),
}


async def _seed(store: Store) -> None:
    """Tasks of three names in every status, created in batches (ties on the creation time,
    broken by key), with 0 to 3 attempts, updated in an order unlike their creation."""
    names = (NAME, "beta", "alpha")
    for batch in range(4):
        await store.insert(
            *(store.task(f"k{(batch * 7 + i * 5) % 31:02}-{batch}", names[i % 3]) for i in range(6))
        )
        store.advance(0.003)
    every = (NAME, "beta", "alpha")
    # a few rounds: claim some, fail some (retried at once), finish some; time moves between
    for round_ in range(3):
        claimed = await store.claim("w1", 6 - round_, names=every)
        for n, task in enumerate(claimed):
            store.advance(0.001)
            if (n + round_) % 3 == 0:
                assert await store.done(task, "w1")
            elif (n + round_) % 3 == 1:
                assert await store.fail(task, "w1", retry_in=0)
            # else: left running
        store.advance(0.002)
    operations = Operations(store.driver, clock=store.clock)
    pending = [t for t in await operations.list_tasks(limit=1000) if t.status.value == "pending"]
    await operations.cancel(pending[0].key, "no longer needed")
    store.advance(0.001)
    await operations.pause(pending[1].key)
    store.advance(0.001)


async def _every_page(operations: Operations, **filters: Any) -> tuple[list[str], list[list[str]]]:
    """The keys of every page going forward, and the pages again going back from the last."""
    pages: list[list[str]] = []
    cursors: list[str | None] = []
    cursor = None
    while True:
        page = await operations.page_tasks(limit=4, cursor=cursor, **filters)
        pages.append([t.key for t in page.tasks])
        cursors.append(page.prev_cursor)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    back: list[list[str]] = [pages[-1]]
    cursor = cursors[-1]
    while cursor is not None:
        page = await operations.page_tasks(limit=4, cursor=cursor, **filters)
        back.append([t.key for t in page.tasks])
        cursor = page.prev_cursor
    back.reverse()
    return [key for keys in pages for key in keys], back if len(pages) > 1 else pages


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("descending", [False, True], ids=["up", "down"])
async def test_each_order_pages_every_task_once_forward_and_back(
    store: Store, order: str, descending: bool
) -> None:
    await _seed(store)
    operations = Operations(store.driver, clock=store.clock)
    tasks = await operations.list_tasks(limit=1000)
    if order == "finished":
        tasks = [t for t in tasks if t.finish_time is not None]
    expected = [t.key for t in sorted(tasks, key=ORDERS[order], reverse=descending)]
    assert len(expected) >= 5  # several pages
    sort = f"-{order}" if descending else order
    seen, back = await _every_page(operations, sort=sort)
    assert seen == expected
    assert [key for keys in back for key in keys] == expected  # the same pages, going back


@pytest.mark.parametrize(
    ("sort", "filters"),
    [
        ("-updated", {"status": "pending"}),
        ("updated", {"name": "beta"}),
        ("-attempts", {"status": "succeeded"}),
        ("attempts", {"worker_id": "w1"}),
        ("status", {"name": "alpha"}),
        ("-name", {"status": "running"}),
        ("-finished", {"status": "succeeded"}),
        ("-created", {"name": NAME}),
        ("-key", {"key_prefix": "k1"}),
        ("finished", {"status": "pending"}),  # nothing pending has finished
    ],
)
async def test_orders_with_filters(store: Store, sort: str, filters: dict[str, Any]) -> None:
    await _seed(store)
    operations = Operations(store.driver, clock=store.clock)
    unfiltered = await operations.list_tasks(limit=1000)
    order = sort.lstrip("-")

    def wanted(t: TaskInfo) -> bool:
        return all(
            {
                "status": t.status.value,
                "name": t.name,
                "worker_id": "w1" if any(w.worker_id == "w1" for w in t.worker_states) else None,
                "key_prefix": value if t.key.startswith(value) else None,
            }[field]
            == value
            for field, value in filters.items()
        ) and (order != "finished" or t.finish_time is not None)

    expected = [t.key for t in sorted(filter(wanted, unfiltered), key=ORDERS[order], reverse=sort[0] == "-")]
    seen, back = await _every_page(operations, sort=sort, **filters)
    assert seen == expected
    assert [key for keys in back for key in keys] == expected


async def test_bad_sorts_are_refused_before_any_read(store: Store) -> None:
    operations = Operations(store.driver, clock=store.clock)
    for bad in ("priority", "--created", "", "created ", {"$natural": 1}):
        with pytest.raises(InvalidInput, match="sort"):
            await operations.page_tasks(sort=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="key prefix lists in key order"):
        await operations.page_tasks(sort="-updated", key_prefix="k")
    await _seed(store)
    page = await operations.page_tasks(sort="-updated", limit=2)
    assert page.next_cursor is not None and page.prev_cursor is None  # the first page
    with pytest.raises(InvalidInput, match="another order"):
        await operations.page_tasks(sort="updated", cursor=page.next_cursor)  # the other way
    with pytest.raises(InvalidInput, match="another order"):
        await operations.page_tasks(sort="-created", cursor=page.next_cursor)


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"status": "pending"},
        {"name": "beta"},
        {"worker_id": "w1"},
        {"key_prefix": "k1"},
        {"status": "cancelled"},
    ],
    ids=lambda f: ",".join(f) or "all",
)
async def test_counts_match_the_listing_and_stop_at_the_cap(store: Store, filters: dict[str, Any]) -> None:
    await _seed(store)
    operations = Operations(store.driver, clock=store.clock)
    listed = await operations.list_tasks(limit=1000, **filters)
    counted = await operations.count_tasks(**filters)
    assert (counted.count, counted.capped) == (len(listed), False)
    if len(listed) > 2:
        assert await operations.count_tasks(cap=2, **filters) == type(counted)(2, True)
    with pytest.raises(InvalidInput, match="cap"):
        await operations.count_tasks(cap=0)
