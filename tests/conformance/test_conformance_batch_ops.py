"""``Operations.get_tasks`` and ``Operations.restart_many`` (SPEC F18) on every driver: one read
for many keys; per-key restart outcomes under the rules of ``restart``."""

from __future__ import annotations

import pytest

from mscheduler import Operations
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.operations import MANY_MAX
from tests.conformance.support import Store
from tests.conformance.test_conformance_maintenance import finished


def operations(store: Store) -> Operations:
    return Operations(store.driver, clock=store.clock)


async def test_get_tasks_returns_the_known_keys_in_the_order_asked(store: Store) -> None:
    ops = operations(store)
    for key in ("a", "b", "c"):
        await store.add(key)
    infos = await ops.get_tasks(["c", "nope", "a", "c"])
    assert list(infos) == ["c", "a"]
    assert infos["a"].key == "a" and infos["a"].status.value == "pending"
    assert await ops.get_tasks([]) == {}


@pytest.mark.parametrize("keys", ["abc", [""], ["ok", 3], ["x" * 600], None])
async def test_get_tasks_refuses_bad_keys(store: Store, keys: object) -> None:
    with pytest.raises(InvalidInput):
        await operations(store).get_tasks(keys)  # type: ignore[arg-type]


async def test_get_tasks_is_bounded(store: Store) -> None:
    with pytest.raises(InvalidInput, match="at most"):
        await operations(store).get_tasks([f"k{i}" for i in range(MANY_MAX + 1)])


async def test_restart_many_reports_each_key(store: Store) -> None:
    ops = operations(store)
    await finished(store, "failed", "failed")
    await finished(store, "cancelled", "cancelled")
    await finished(store, "done", "succeeded")
    await store.add("pending")
    outcomes = await ops.restart_many(["failed", "done", "ghost", "pending", "cancelled", "failed"])
    assert list(outcomes) == ["failed", "done", "ghost", "pending", "cancelled"]
    assert {k: o.outcome for k, o in outcomes.items()} == {
        "failed": "restarted",
        "done": "refused",
        "ghost": "unknown",
        "pending": "refused",
        "cancelled": "restarted",
    }
    assert outcomes["failed"].restarted and outcomes["failed"].task is not None
    assert outcomes["done"].status == "succeeded" and "force=True" in (outcomes["done"].rule or "")
    assert outcomes["pending"].status == "pending"
    # refused ones are unchanged; restarted ones are pending with a fresh generation
    assert await store.status("done") == "succeeded"
    assert await store.status("failed") == "pending"
    assert await store.status("cancelled") == "pending"
    forced = await ops.restart_many(["done"], force=True)
    assert forced["done"].restarted and await store.status("done") == "pending"


async def test_restart_many_validates_every_key_before_restarting_any(store: Store) -> None:
    ops = operations(store)
    await finished(store, "failed", "failed")
    with pytest.raises(InvalidInput):
        await ops.restart_many(["failed", ""])
    assert await store.status("failed") == "failed"
