"""Bulk actions through ``Operations`` on every driver (issue 20): over a list of keys
(``control_many``) and over a filter, page by page (``control_matching``), each task its own
compare-and-set under the action's rule, an outcome per key; tasks created after it began are left
alone; bad input changes nothing."""

from __future__ import annotations

import pytest

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.operations import BulkOutcome, Operations
from tests.conformance.support import NAME, Store


async def test_an_action_over_keys_gives_an_outcome_per_key(store: Store) -> None:
    for key in ("a", "b", "c"):
        await store.add(key)
    ops = Operations(store.driver, clock=store.clock)
    await ops.cancel("b")
    outcomes = await ops.control_many("cancel", ["a", "b", "gone", "c"], reason="dup", by="api:alice")
    assert [(o.key, o.outcome) for o in outcomes] == [
        ("a", "done"),
        ("b", "refused"),
        ("gone", "unknown"),
        ("c", "done"),
    ]
    refused = outcomes[1]
    assert refused.status == "cancelled" and refused.rule == "only a pending or running task can be cancelled"
    assert (await ops.get_task("a")).cancelled == {"reason": "dup", "time": store.now, "by": "api:alice"}
    restarted = await ops.control_many("restart", ["a", "b"])
    assert [o.outcome for o in restarted] == ["done", "done"]
    removed = await ops.control_many("remove", ["a"])
    assert removed == [BulkOutcome("a", "done")] and await store.driver.get_task("a") is None


async def test_an_action_over_a_filter_goes_page_by_page_and_leaves_new_tasks_alone(store: Store) -> None:
    await store.insert(*(store.task(f"t{i:03}") for i in range(23)))
    await store.insert(store.task("other-1", "other"))
    running = await store.claim_one("w1")
    assert running is not None
    store.advance(0.01)
    ops = Operations(store.driver, clock=store.clock)
    pages = []
    matching = await ops.control_matching("pause", name=NAME, page_size=5)
    async for page in matching:
        pages.append(page)
        if len(pages) == 2:  # created while the action runs: not part of it
            store.advance(0.01)
            await store.add("late-1")
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert all(o.outcome == "done" for p in pages for o in p)
    paused = {t.key for t in await ops.list_tasks(limit=100) if t.paused}
    assert paused == {f"t{i:03}" for i in range(23)}  # the running one too; not other-1, not late-1


async def test_refusals_are_reported_with_their_rule(store: Store) -> None:
    for key in ("p1", "p2"):
        await store.add(key)
    ops = Operations(store.driver, clock=store.clock)
    await ops.cancel("p2")
    outcomes = [o async for page in await ops.control_matching("resume") for o in page]
    assert [(o.key, o.outcome, o.status) for o in outcomes] == [
        ("p1", "done", None),
        ("p2", "refused", "cancelled"),
    ]
    assert outcomes[1].rule == "a finished task cannot be resumed"


@pytest.mark.parametrize(
    ("action", "options", "filters", "match"),
    [
        ("explode", {}, {}, "action"),
        ("cancel", {"reason": "x" * 3000}, {}, "reason"),
        ("restart", {"force": "yes"}, {}, "force"),
        ("cancel", {}, {"status": "lost"}, "status"),
        ("cancel", {}, {"name": {"$ne": ""}}, "name"),
        ("cancel", {"page_size": 0}, {}, "page_size"),
    ],
)
async def test_bad_input_changes_nothing(
    store: Store, action: str, options: dict[str, object], filters: dict[str, object], match: str
) -> None:
    await store.add("a")
    ops = Operations(store.driver, clock=store.clock)
    with pytest.raises(InvalidInput, match=match):
        await ops.control_matching(action, **options, **filters)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        await ops.control_many(action if match != "action" else "explode", ["a", {"$gt": ""}])  # type: ignore[list-item]
    assert (await ops.get_task("a")).status.value == "pending"
