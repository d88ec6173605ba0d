"""Task listings on every driver: key prefix, worker, creation time range, cursor paging, and
their combinations with status and name (issue 10). Driver level (``ListParams``) and through
``Operations.page_tasks``, which validates the filters and makes the cursors."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mscheduler.domain.listing import ListParams
from mscheduler.operations import Operations
from tests.conformance.support import NAME, Store


async def _keys(store: Store, **kwargs: object) -> list[str]:
    return [t["key"] for t in await store.driver.list_tasks(ListParams(**kwargs))]  # type: ignore[arg-type]


async def test_key_prefix_lists_matching_keys_in_key_order(store: Store) -> None:
    # created in an order unlike key order: a prefix listing is in key order
    for key in ("inv-2", "other", "inv-10", "inv", "in", "invx", "inw", "inv-1"):
        await store.add(key, name="beta" if key == "inv-10" else NAME)
        store.advance(0.001)
    assert await _keys(store, key_prefix="inv-") == ["inv-1", "inv-10", "inv-2"]
    assert await _keys(store, key_prefix="inv") == ["inv", "inv-1", "inv-10", "inv-2", "invx"]
    assert await _keys(store, key_prefix="inv", name="beta") == ["inv-10"]
    assert await _keys(store, key_prefix="inv", after_key="inv-10") == ["inv-2", "invx"]
    assert await _keys(store, key_prefix="inv", limit=2) == ["inv", "inv-1"]
    assert await _keys(store, key_prefix="nothing") == []


async def test_key_prefix_with_characters_at_the_edges_of_unicode(store: Store) -> None:
    for key in ("a\U0010ffff", "a\U0010ffffz", "b", "\ud7ffx", "\ue000"):
        await store.add(key)
    assert await _keys(store, key_prefix="a\U0010ffff") == ["a\U0010ffff", "a\U0010ffffz"]
    assert await _keys(store, key_prefix="a") == ["a\U0010ffff", "a\U0010ffffz"]
    assert await _keys(store, key_prefix="\ud7ff") == ["\ud7ffx"]


@pytest.mark.global_claim_order
async def test_worker_lists_tasks_with_an_entry_of_that_worker_once(store: Store) -> None:
    await store.add("fan", concurrent_worker_cnt=2, priority=3)  # priorities: the claim order
    await store.add("retried", priority=2)
    await store.add("solo", priority=1)
    await store.add("untouched")
    assert await store.claim_keys("w1") == ["fan"]
    assert await store.claim_keys("w2") == ["fan"]
    retried = await store.claim_one("w1")
    assert retried is not None and retried.key == "retried"
    assert await store.fail(retried, "w1", retry_in=0) is True
    again = await store.claim_one("w1")  # w1 holds two entries of "retried" now
    assert again is not None and again.key == "retried"
    solo = await store.claim_one("w2")
    assert solo is not None and solo.key == "solo"
    assert await store.done(solo, "w2") is True

    assert await _keys(store, worker_id="w1") == ["fan", "retried"]
    assert await _keys(store, worker_id="w2") == ["fan", "solo"]
    assert await _keys(store, worker_id="w2", status="succeeded") == ["solo"]
    assert await _keys(store, worker_id="w1", name="other") == []
    assert await _keys(store, worker_id="w3") == []


async def test_created_range_is_from_inclusive_to_exclusive(store: Store) -> None:
    start = store.now
    for key in ("t0", "t1", "t2", "t3"):
        await store.add(key, name="alpha" if key in ("t1", "t3") else NAME)
        store.advance(1)
    at = [start + timedelta(seconds=s) for s in range(4)]
    assert await _keys(store, created_from=at[1], created_to=at[3]) == ["t1", "t2"]
    assert await _keys(store, created_from=at[2]) == ["t2", "t3"]
    assert await _keys(store, created_to=at[1]) == ["t0"]
    assert await _keys(store, created_from=at[1], name="alpha") == ["t1", "t3"]
    assert await _keys(store, created_to=at[2], status="pending") == ["t0", "t1"]
    assert await _keys(store, created_from=at[1], key_prefix="t") == ["t1", "t2", "t3"]


async def test_after_continues_strictly_after_the_sort_key_with_ties(store: Store) -> None:
    await store.insert(*(store.task(k) for k in ("b", "a", "c")))  # one create_time: key order
    first = store.now
    store.advance(1)
    await store.add("d")
    assert await _keys(store, after_time=first, after_key="a") == ["b", "c", "d"]
    assert await _keys(store, after_time=first, after_key="c") == ["d"]
    assert await _keys(store, after_time=store.now, after_key="d") == []
    assert await _keys(store, after_time=first, after_key="b", status="pending", limit=1) == ["c"]
    assert await _keys(store, after_time=first, after_key="a", name=NAME) == ["b", "c", "d"]


async def test_cursor_pages_through_250_tasks_each_exactly_once_in_order(store: Store) -> None:
    # batches of ten share a creation time (ties broken by key), batches 1 ms apart
    for batch in range(25):
        await store.insert(*(store.task(f"t{(batch * 37 + i * 11) % 1000:03}-{batch}") for i in range(10)))
        store.advance(0.001)
    expected = [t["key"] for t in await store.all_tasks()]
    assert len(expected) == 250
    operations = Operations(store.driver, clock=store.clock)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await operations.page_tasks(limit=7, cursor=cursor)
        seen += [t.key for t in page.tasks]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == expected
    assert pages == 36  # 35 full pages and one of 5

    # a key-prefix listing pages in key order through its own cursors
    prefixed = sorted(k for k in expected if k.startswith("t1"))
    seen, cursor = [], None
    while True:
        page = await operations.page_tasks(key_prefix="t1", limit=10, cursor=cursor)
        seen += [t.key for t in page.tasks]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == prefixed


async def test_cursor_pages_a_filtered_listing(store: Store) -> None:
    for i in range(30):
        await store.add(f"k{i:02}", name="alpha" if i % 3 else NAME)
        store.advance(0.001)
    for _ in range(5):
        assert await store.claim_keys("w1") != []
    operations = Operations(store.driver, clock=store.clock)
    for filters in ({"name": "alpha"}, {"status": "pending"}, {"worker_id": "w1"}, {"name": NAME}):
        expected = [t.key for t in await operations.list_tasks(limit=1000, **filters)]  # type: ignore[arg-type]
        seen: list[str] = []
        cursor = None
        while True:
            page = await operations.page_tasks(limit=4, cursor=cursor, **filters)  # type: ignore[arg-type]
            seen += [t.key for t in page.tasks]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == expected, filters
        assert expected


async def test_the_last_full_page_has_no_next_cursor(store: Store) -> None:
    for key in ("a", "b", "c", "d"):
        await store.add(key)
    operations = Operations(store.driver, clock=store.clock)
    first = await operations.page_tasks(limit=2)
    assert [t.key for t in first.tasks] == ["a", "b"] and first.next_cursor is not None
    second = await operations.page_tasks(limit=2, cursor=first.next_cursor)
    assert [t.key for t in second.tasks] == ["c", "d"] and second.next_cursor is None
    assert (await operations.page_tasks(limit=4)).next_cursor is None


async def test_removed_tasks_leave_the_listing_and_pages_skip_nothing(store: Store) -> None:
    from mscheduler.drivers.base import ControlParams

    for i in range(12):
        await store.add(f"t{i:02d}")
        if i % 3 == 0:
            store.advance(0.001)  # some tasks share a creation time, some do not
    for key in ("t00", "t05", "t11"):
        assert await store.driver.control_task(ControlParams(key, "remove", ("pending",), store.now))
    expected = [f"t{i:02d}" for i in range(12) if i not in (0, 5, 11)]
    assert await _keys(store) == expected
    assert await _keys(store, key_prefix="t0") == [k for k in expected if k.startswith("t0")]
    ops = Operations(store.driver, clock=store.clock)
    seen: list[str] = []
    cursor = None
    while True:
        page = await ops.page_tasks(limit=4, cursor=cursor)
        seen += [t.key for t in page.tasks]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == expected
