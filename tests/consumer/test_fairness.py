"""A consumer's fairness between keys: weights, bad settings, keys alongside tasks without one."""

from __future__ import annotations

from typing import Any

import pytest

from mscheduler import Consumer, Fairness, InvalidInput, MemoryDriver, Task, TaskContext, TaskOption
from mscheduler.testing import scheduler_kit


def _app(started: list[str]) -> dict[str, Any]:
    async def export(params: dict[str, Any], ctx: TaskContext) -> None:
        started.append(params["tenant"])

    return {"export": export}


async def _send(kit: Any, tenant: str | None, n: int) -> None:
    option = TaskOption(fair_key=tenant) if tenant is not None else TaskOption()
    await kit.publisher.send_many(
        Task(f"{tenant}-{i}", "export", {"tenant": tenant or "none"}, option=option) for i in range(n)
    )


async def test_a_key_of_weight_three_takes_three_claims_to_the_others_one() -> None:
    started: list[str] = []
    kit = scheduler_kit(_app(started), concurrency=1, fairness=Fairness(weights={"gold": 3}))
    await _send(kit, "gold", 30)
    await _send(kit, "free", 30)
    await kit.run("free-4")
    await kit.stop()
    # the kit may run more after free-4: the order up to it is what counts
    assert started[:20] == ["free", "gold", "gold", "gold"] * 5, started


async def test_tasks_without_a_key_take_their_turn_among_the_keys() -> None:
    started: list[str] = []
    kit = scheduler_kit(_app(started), concurrency=1)
    await _send(kit, "big", 50)
    await _send(kit, None, 3)
    await kit.run("None-2")
    await kit.stop()
    assert started[:6].count("none") == 3, started


async def test_without_keys_a_backlog_goes_first() -> None:
    started: list[str] = []
    kit = scheduler_kit(_app(started), concurrency=1)
    await kit.publisher.send_many(Task(f"big-{i}", "export", {"tenant": "big"}) for i in range(20))
    await kit.publisher.send_many(Task(f"small-{i}", "export", {"tenant": "small"}) for i in range(2))
    await kit.run("small-1")
    await kit.stop()
    assert started[:20] == ["big"] * 20


@pytest.mark.parametrize(
    "bad",
    [
        {"fairness": {"weights": {"a": 3}}},
    ],
)
def test_a_consumer_refuses_a_fairness_that_is_not_one(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput, match="fairness: a Fairness"):
        Consumer(MemoryDriver(), **bad)


@pytest.mark.parametrize("weights", [{"a": 0}, {"a": 1001}, {"a|b": 2}, {"a": True}])
def test_bad_weights_are_refused(weights: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Fairness(weights=weights)
