"""``StepInputs``: the input reads of steps started in one loop turn are one ``read_results``;
each step gets only its keys, and two steps needing the same step do not share one object."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from mscheduler import Child, MemoryDriver, Publisher, Task
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import ClaimParams, FinishParams
from mscheduler.runtime.consumer.inputs import StepInputs
from mscheduler.testing.faults import FaultyDriver
from tests.helpers import as_driver


async def test_asks_of_one_loop_turn_are_one_read_and_shared_keys_are_copied() -> None:
    store = MemoryDriver()
    steps = [Child("a"), Child("b"), Child("c", needs=["a", "b"]), Child("d", needs=["a"])]
    await Publisher(store).send(Task("w", "w", children=steps))
    now = datetime.now(UTC)
    for claimed in await store.claim(ClaimParams("w1", ["a", "b"], now, ["t1", "t2"])):
        await store.finish(
            [FinishParams(claimed.key, "w1", claimed.attempt, now, "succeeded", {"of": claimed.key})]
        )
    counted = FaultyDriver(store)
    inputs = StepInputs(as_driver(counted))
    first, second = await asyncio.gather(inputs.read(["w/a", "w/b"]), inputs.read(["w/a"]))
    assert counted.calls["read_results"] == 1 and inputs.reads == 1
    assert set(first) == {"w/a", "w/b"} and set(second) == {"w/a"}
    assert first["w/a"].result == second["w/a"].result == {"of": "w/a"}
    assert first["w/a"].result is not second["w/a"].result
    await inputs.read(["w/b"])  # a later turn: a read of its own
    assert counted.calls["read_results"] == 2


async def test_a_failed_read_fails_every_ask_of_its_batch() -> None:
    counted = FaultyDriver(MemoryDriver())
    counted.fail_next("read_results")
    inputs = StepInputs(as_driver(counted))
    asks = await asyncio.gather(inputs.read(["x"]), inputs.read(["y"]), return_exceptions=True)
    assert [type(a) for a in asks] == [StorageError, StorageError]
