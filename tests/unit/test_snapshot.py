"""``mscheduler dev --data``: a MemoryDriver's store saved to a file and restored into a fresh one
behaves as the original — the same tasks, plans, limits and events, listed, counted and claimed
the same way, unique hashes still held — and a file that is not a snapshot is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mscheduler import FakeClock, InvalidInput, MemoryDriver, Operations, Task, TaskOption
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import ClaimParams, FinishParams
from mscheduler.drivers.memory.snapshot import load, save
from mscheduler.services.events import Events


async def _fill(driver: MemoryDriver, clock: FakeClock) -> None:
    ops = Operations(driver, clock=clock)
    await ops.send(Task("due", "job", {"n": 1}, option=TaskOption(priority=5)), allow_unknown=True)
    await ops.send(
        Task("later", "job", {}, option=TaskOption(run_at=clock.now().replace(year=2031))), allow_unknown=True
    )
    await ops.send(Task("uniq", "job", {"u": 1}, unique_by="params"), allow_unknown=True)
    await ops.send(
        Task("grouped", "job", {}, option=TaskOption(specific_groups=("gpu",))), allow_unknown=True
    )
    await ops.send(Task("fam", "fam", {}, children=["one", "two"]), allow_unknown=True)
    await ops.send(Task("done", "job", {}), allow_unknown=True)
    clock.advance(1)
    now = clock.now()
    [claimed] = await driver.claim(ClaimParams("w1", ["job"], now, ["att-1"]))
    assert claimed.key == "due"
    await driver.finish([FinishParams("due", "w1", "att-1", now, "succeeded", {"ok": True})])
    await ops.pause("done")
    timing = PlanTiming(schedule=EverySchedule(interval=60, start=now))
    await ops.add_plan(Plan(plan_id="p1", name="job", timing=timing))
    await ops.set_limit("job", max_running=3)


async def _picture(driver: MemoryDriver, clock: FakeClock) -> Any:
    ops = Operations(driver, clock=clock)
    return (
        [t.model_dump() for t in await ops.list_tasks(limit=100)],
        [t.key for t in await ops.list_tasks(finished_from=clock.now().replace(year=2000), limit=100)],
        [t.key for t in await ops.list_tasks(group="gpu")],
        await ops.count_by_status(),
        [p.model_dump() for p in await ops.list_plans()],
        [info.as_dict() for info in await ops.list_limits()],
        [e.model_dump() for e in await Events(driver, clock=clock).list(limit=1000)],
    )


async def test_a_saved_store_comes_back_the_same(tmp_path: Path) -> None:
    clock = FakeClock()
    original = MemoryDriver(clock=clock, events=True)
    await _fill(original, clock)
    path = tmp_path / "store.json"
    assert save(original, path, clock.now()) > 0

    restored = MemoryDriver(clock=clock, events=True)
    assert load(restored, path) == len(original._tasks)
    assert await _picture(restored, clock) == await _picture(original, clock)

    # the indexes work: the next claim takes the same task in both, unique params still held
    now = clock.now()
    for driver in (original, restored):
        claimed = await driver.claim(ClaimParams("w2", ["job"], now, ["att-2"]))
        assert [c.key for c in claimed] == ["uniq"]
        assert (
            await Operations(driver, clock=clock).send(
                Task("uniq-2", "job", {"u": 1}, unique_by="params"), allow_unknown=True
            )
            is False
        )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json at all", "not a snapshot (not JSON"),
        ('{"format": "something else"}', "not a mscheduler-memory-snapshot of version 1"),
        ('{"format": "mscheduler-memory-snapshot", "version": 1}', "not a whole snapshot"),
    ],
)
def test_a_file_that_is_not_a_snapshot_is_refused(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InvalidInput) as refused:
        load(MemoryDriver(), path)
    assert says in str(refused.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read the snapshot"):
        load(MemoryDriver(), tmp_path / "nope.json")


async def test_a_snapshot_goes_into_an_empty_store_only(tmp_path: Path) -> None:
    clock = FakeClock()
    driver = MemoryDriver(clock=clock)
    await Operations(driver, clock=clock).send(Task("k", "job"), allow_unknown=True)
    path = tmp_path / "s.json"
    save(driver, path, clock.now())
    with pytest.raises(InvalidInput, match="into an empty store only"):
        load(driver, path)


async def _saved(tmp_path: Path) -> dict[str, Any]:
    """A real snapshot, as plain JSON to tamper with."""
    clock = FakeClock()
    driver = MemoryDriver(clock=clock, events=True)
    await Operations(driver, clock=clock).send(Task("k", "job", {"n": 1}), allow_unknown=True)
    path = tmp_path / "good.json"
    save(driver, path, clock.now())
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@pytest.mark.parametrize(
    ("tamper", "says"),
    [
        (lambda d: d["tasks"][0].update(params={"$code": "function () { return 1 }"}), "a Code, which"),
        (lambda d: d["tasks"][0]["params"].update(n={"$regex": ".*", "$options": ""}), "a Regex, which"),
        (lambda d: d["tasks"][0].update(key="k\n2030-01-01 INFO forged"), "control characters"),
        (lambda d: d["tasks"][0].update(name="not a name"), "invalid task name"),
        (lambda d: d["events"][0].update(detail={"by": {"$oid": "5f1d7f0e8f1b2c3d4e5f6a7b"}}), "ObjectId"),
        (lambda d: d["tasks"][0].update(params={"$where": "1"}), "field name"),
        (lambda d: d["limits"].append({"_id": "$bad", "names": []}), "invalid task name"),
        (lambda d: d["tasks"][0].update(params=_nested(200)), "nested deeper than 64 levels"),
    ],
    ids=["code", "regex", "newline-key", "bad-name", "oid-in-event", "operator-key", "bad-limit", "deep"],
)
async def test_a_hostile_snapshot_is_refused_whole(tmp_path: Path, tamper: Any, says: str) -> None:
    data = await _saved(tmp_path)
    tamper(data)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    driver = MemoryDriver()
    with pytest.raises(InvalidInput) as refused:
        load(driver, path)
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert not driver._tasks and not driver._events  # nothing was put in


def test_a_snapshot_nested_past_the_parser_is_one_clear_refusal(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidInput, match="nested too deeply"):
        load(MemoryDriver(), path)


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value
