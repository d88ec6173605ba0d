"""MongoDriver's error handling: transient errors are retried with bounded backoff and never lose or
duplicate a state change; lost replies are resolved by reading back; permanent errors surface.

A ``FlakyCollection`` proxy wraps the driver's (mongomock) tasks collection and makes chosen calls
raise PyMongo's own errors, before the command is applied (nothing happened) or after it (the
reply was lost: the outcome is unknown to the driver).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from pymongo.errors import (
    AutoReconnect,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    WriteConcernError,
)

import mscheduler.drivers.mongo.driver as mongo_module
from mscheduler import Consumer, FakeClock, Publisher, Task, TaskOption, TaskStatus
from mscheduler.domain.exceptions import ConsumerStopped, StorageError
from mscheduler.domain.listing import ListParams
from mscheduler.drivers.base import ClaimParams, FinishParams, PingParams
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database
from tests.helpers import Recorder
from tests.scenarios.harness import advance_until

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)

TRANSIENT = {
    "AutoReconnect": lambda: AutoReconnect("connection reset by peer"),
    "NetworkTimeout": lambda: NetworkTimeout("timed out"),
    "NotPrimaryError": lambda: NotPrimaryError("not primary"),
    "NotWritablePrimary-10107": lambda: OperationFailure("not writable primary", code=10107),
    "WriteConcernError-91": lambda: WriteConcernError("shutdown in progress", code=91, details={}),
}
transient = pytest.mark.parametrize("error", list(TRANSIENT.values()), ids=list(TRANSIENT))


class FailingCursor:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def sort(self, *args: Any, **kwargs: Any) -> FailingCursor:
        return self

    limit = skip = hint = max_time_ms = sort

    def __aiter__(self) -> FailingCursor:
        return self

    async def __anext__(self) -> Any:
        raise self.error


class FlakyCollection:
    """The collection, except that planned calls raise before or after being applied."""

    COROUTINES = ("find_one_and_update", "find_one", "update_one", "update_many", "bulk_write", "insert_many")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: Counter[str] = Counter()
        self._plans: dict[str, deque[tuple[bool, BaseException]]] = {}

    def fail(self, method: str, error: BaseException, *, after_apply: bool = False, times: int = 1) -> None:
        for _ in range(times):
            self._plans.setdefault(method, deque()).append((after_apply, error))

    def planned(self, method: str) -> int:
        """Faults planned for ``method`` and not injected yet."""
        return len(self._plans.get(method, ()))

    def _next_fault(self, method: str) -> tuple[bool, BaseException] | None:
        plans = self._plans.get(method)
        return plans.popleft() if plans else None

    def find(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["find"] += 1
        fault = self._next_fault("find")
        return FailingCursor(fault[1]) if fault is not None else self._inner.find(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self.COROUTINES:
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            fault = self._next_fault(name)
            if fault is not None and not fault[0]:
                raise fault[1]
            result = await attr(*args, **kwargs)
            if fault is not None:
                raise fault[1]
            return result

        return call


async def flaky_driver(*, retries: int = 5) -> tuple[MongoDriver, FlakyCollection]:
    driver = MongoDriver(
        mongomock_database(), create_indexes=True, retries=retries, backoff=0.0005, max_backoff=0.002
    )
    await driver.setup()
    flaky = FlakyCollection(driver.tasks)
    # on mongomock the primary / majority-read views are the collection itself
    driver.tasks = driver.tasks_primary = driver.tasks_recovery = flaky
    return driver, flaky


async def publish(driver: MongoDriver, *keys: str, **option: Any) -> None:
    publisher = Publisher(driver, clock=FakeClock(NOW))
    await publisher.send_many([Task(key, "job", {"key": key}, option=TaskOption(**option)) for key in keys])


def claim_params(worker_id: str = "w1", n: int = 1) -> ClaimParams:
    return ClaimParams(worker_id, ["job"], NOW, [f"{worker_id}-attempt-{i}" for i in range(n)], LEASE)


async def entries(driver: MongoDriver, key: str) -> list[dict[str, Any]]:
    doc = await driver.get_task(key)
    assert doc is not None
    return doc["state"]["worker_states"]


# -- transient errors before the command applies: retried, applied once --------------------------


@transient
async def test_transient_error_before_applying_is_retried(error: Any) -> None:
    driver, flaky = await flaky_driver()
    flaky.fail("insert_many", error())
    await publish(driver, "t1")
    flaky.fail("find_one_and_update", error())
    (claimed,) = await driver.claim(claim_params())
    flaky.fail("update_many", error())
    ping = await driver.ping(PingParams("w1", NOW, {NOW + LEASE * 2: {"t1": claimed.attempt}}))
    assert list(ping.alive) == ["t1"]
    flaky.fail("update_one", error())
    assert await driver.finish([FinishParams("t1", "w1", claimed.attempt, NOW, "succeeded", result=1)]) == [
        True
    ]
    assert flaky.calls["insert_many"] == flaky.calls["find_one_and_update"] == 2
    assert flaky.calls["update_one"] == 2
    (entry,) = await entries(driver, "t1")
    assert (entry["status"], entry["result"]) == ("succeeded", 1)


# -- lost replies: the write happened; the driver finds out instead of doing it again -------------


@transient
async def test_lost_claim_reply_is_recovered_by_the_attempt_token_not_duplicated(error: Any) -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1", "t2")
    flaky.fail("find_one_and_update", error(), after_apply=True)
    claimed = await driver.claim(claim_params())
    assert [c.key for c in claimed] == ["t1"]
    assert flaky.calls["find_one_and_update"] == 1, "not sent again: the recovery read found it"
    assert flaky.calls["find_one"] == 1
    (entry,) = await entries(driver, "t1")
    assert (entry["worker_id"], entry["attempt"], entry["status"]) == ("w1", claimed[0].attempt, "running")
    assert await entries(driver, "t2") == [], "no orphan claim on another task"


async def test_claim_failing_before_applying_is_sent_again_after_an_empty_recovery_read() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    flaky.fail("find_one_and_update", AutoReconnect("reset"))
    assert len(await driver.claim(claim_params())) == 1
    assert flaky.calls["find_one_and_update"] == 2 and flaky.calls["find_one"] == 1
    assert len(await entries(driver, "t1")) == 1


@transient
async def test_lost_finish_reply_lands_exactly_once(error: Any) -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    (claimed,) = await driver.claim(claim_params())
    flaky.fail("update_one", error(), after_apply=True)
    finish = FinishParams(
        "t1", "w1", claimed.attempt, NOW + timedelta(seconds=1), "succeeded", result={"n": 1}
    )
    assert await driver.finish([finish]) == [True], "read back: it landed"
    (entry,) = await entries(driver, "t1")
    assert (entry["status"], entry["result"]) == ("succeeded", {"n": 1})
    info = await Publisher(driver).get("t1")
    assert info.status is TaskStatus.SUCCEEDED and info.success_cnt == 1


async def test_lost_reply_of_a_batched_finish_lands_each_outcome_once() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1", "t2")
    claimed = await driver.claim(claim_params(n=2))
    assert len(claimed) == 2
    flaky.fail("bulk_write", NetworkTimeout("timed out"), after_apply=True)
    later = NOW + timedelta(seconds=1)
    batch = [
        FinishParams(claimed[0].key, "w1", claimed[0].attempt, later, "succeeded", result=0),
        FinishParams(
            claimed[1].key,
            "w1",
            claimed[1].attempt,
            later,
            "failed",
            error={"type": "E", "message": "m", "traceback": None},
            retry_at=later,
        ),
    ]
    assert await driver.finish(batch) == [True, True]
    assert [e["status"] for e in await entries(driver, claimed[0].key)] == ["succeeded"]
    assert [e["status"] for e in await entries(driver, claimed[1].key)] == ["failed"]


async def test_finish_of_a_lost_lease_is_refused_even_through_retries() -> None:
    """Fencing and retries together: the retried write of an expired attempt still changes nothing."""
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    (claimed,) = await driver.claim(claim_params())
    flaky.fail("update_one", AutoReconnect("reset"))
    too_late = NOW + LEASE + timedelta(seconds=1)
    assert await driver.finish([FinishParams("t1", "w1", claimed.attempt, too_late, "succeeded")]) == [False]
    assert [e["status"] for e in await entries(driver, "t1")] == ["running"]


async def test_lost_ping_reply_extends_the_lease_once() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    (claimed,) = await driver.claim(claim_params())
    new_expire = NOW + LEASE * 2
    flaky.fail("update_many", WriteConcernError("wtimeout", code=64, details={}), after_apply=True)
    result = await driver.ping(
        PingParams("w1", NOW + timedelta(seconds=1), {new_expire: {"t1": claimed.attempt}})
    )
    assert list(result.alive) == ["t1"] and result.lost == []
    (entry,) = await entries(driver, "t1")
    assert entry["ping_expire_time"] == new_expire


async def test_lost_insert_reply_leaves_one_task() -> None:
    """The retry meets the key it inserted itself: still one task, never two. (``send`` then says
    False, "it existed": after an unknown outcome the driver cannot tell who created it. Not
    asserted here: a documented limit, see docs/guarantees.md.)"""
    driver, flaky = await flaky_driver()
    flaky.fail("insert_many", AutoReconnect("reset"), after_apply=True)
    publisher = Publisher(driver, clock=FakeClock(NOW))
    await publisher.send(Task("t1", "job"))
    assert flaky.calls["insert_many"] == 2
    assert [t["key"] for t in await driver.list_tasks(ListParams())] == ["t1"]


# -- giving up: bounded, and said clearly ---------------------------------------------------------


async def test_after_the_retries_a_transient_error_surfaces_as_transient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver, flaky = await flaky_driver(retries=4)
    driver.backoff, driver.max_backoff = 0.01, 0.03
    await publish(driver, "t1")
    sleeps: list[float] = []

    async def record_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    fake = SimpleNamespace(sleep=record_sleep, gather=asyncio.gather, Semaphore=asyncio.Semaphore)
    monkeypatch.setattr(mongo_module, "asyncio", fake)
    flaky.fail("find_one_and_update", AutoReconnect("primary stepped down"), times=10)
    with pytest.raises(StorageError) as info:
        await driver.claim(claim_params())
    assert info.value.transient
    assert "claim failed after 5 tries" in str(info.value) and "primary stepped down" in str(info.value)
    assert isinstance(info.value.__cause__, AutoReconnect)
    assert flaky.calls["find_one_and_update"] == 5
    assert len(sleeps) == 4, "one backoff between tries"
    assert all(0.005 <= s <= 0.045 for s in sleeps), sleeps  # base 0.01, doubled, capped at 0.03, +-50 %
    assert sleeps[-1] <= 1.5 * driver.max_backoff
    assert await entries(driver, "t1") == []


@pytest.mark.parametrize(
    "error",
    [
        OperationFailure("BadValue: unknown operator $foo", code=2),
        OperationFailure("Unauthorized: not allowed to update", code=13),
    ],
    ids=["BadValue", "Unauthorized"],
)
async def test_a_permanent_error_surfaces_at_once_with_a_clear_message(error: OperationFailure) -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    flaky.fail("find_one_and_update", error)
    with pytest.raises(StorageError) as info:
        await driver.claim(claim_params())
    assert not info.value.transient
    assert str(info.value).startswith("claim failed") and str(error) in str(info.value)
    assert info.value.config == (error.code == 13)  # Unauthorized: configuration, stops a consumer
    assert info.value.__cause__ is error
    assert flaky.calls["find_one_and_update"] == 1, "not retried"


async def test_a_permanent_error_stops_a_consumer_loudly_not_half_alive() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    clock = FakeClock(NOW)
    consumer = Consumer(driver, worker_id="w", clock=clock, poll_interval=1.0)

    async def work(params: Any) -> None:
        return None

    consumer.register("job", work)
    # a configuration error (Unauthorized) stops it; a BadValue alone would not (A5: it is
    # logged at ERROR and retried after a pause, see tests/consumer/test_lifecycle.py)
    flaky.fail("find_one_and_update", OperationFailure("not authorized", code=13))
    with pytest.raises(ConsumerStopped) as info:
        await asyncio.wait_for(consumer.run(), 5)
    assert isinstance(info.value.__cause__, StorageError) and info.value.__cause__.config
    assert consumer.state == "stopped" and (consumer.stop_reason or "").startswith("error:")


# -- through a consumer: the state change lands once ---------------------------------------------


async def test_consumer_on_a_flaky_collection_records_each_outcome_once() -> None:
    driver, flaky = await flaky_driver()
    await publish(
        # leases long enough that fake time racing ahead during the fault storm cannot end one
        driver,
        "t1",
        "t2",
        "t3",
        worker_timeout=timedelta(seconds=60),
        ping_interval=timedelta(seconds=1),
    )
    clock = FakeClock(NOW)
    consumer = Consumer(driver, worker_id="w", clock=clock, poll_interval=1.0, concurrency=1)
    runs: Counter[str] = Counter()

    async def work(params: Any) -> str:
        runs[params["key"]] += 1
        return str(params["key"])

    consumer.register("job", work)
    recorder = Recorder(consumer)
    for method in ("find_one_and_update", "update_one", "update_many", "bulk_write"):
        flaky.fail(method, AutoReconnect("reset"), after_apply=True, times=2)
        flaky.fail(method, NotPrimaryError("stepped down"), times=2)
    async with consumer:
        await advance_until(clock, lambda: recorder.counts["finished"] >= 3, limit=30)
    for method in ("find_one_and_update", "update_one", "update_many"):  # claims, finishes, pings
        assert flaky.planned(method) == 0, f"{method}: not every fault was injected"
    assert runs == {"t1": 1, "t2": 1, "t3": 1}
    assert [d["outcome"] for _, d in recorder.of("finished")] == ["succeeded"] * 3
    for key in ("t1", "t2", "t3"):
        assert [(e["status"], e["result"]) for e in await entries(driver, key)] == [("succeeded", key)]


# -- write concern --------------------------------------------------------------------------------


async def test_majority_write_concern_unless_told_otherwise() -> None:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[Any] = AsyncMongoClient("mongodb://127.0.0.1:1", connect=False)
    try:
        driver = MongoDriver(client["mscheduler"])
        # majority, with a timeout so a lagging secondary cannot block a consumer for ever
        assert driver.tasks.write_concern.document == {"w": "majority", "wtimeout": 10_000}
        assert driver.workers.write_concern.document == {"w": "majority", "wtimeout": 10_000}
        assert MongoDriver(client["mscheduler"], majority=False).tasks.write_concern.document == {}
    finally:
        await client.close()
    # whatever the database object (the driver does not look at its class)
    standin = MongoDriver(mongomock_database())
    assert standin.tasks.write_concern.document == {"w": "majority", "wtimeout": 10_000}


async def test_one_failed_claim_of_a_batch_does_not_orphan_the_others() -> None:
    """The claims of a batch are sent concurrently: when one fails, the ones that were applied are
    still handed to the caller, not left running in the store unknown to anyone."""
    driver, flaky = await flaky_driver()
    await publish(driver, "t1", "t2", "t3")
    flaky.fail("find_one_and_update", OperationFailure("BadValue", code=2))
    claimed = await driver.claim(claim_params(n=3))
    assert len(claimed) == 2
    running = {
        k for k in ("t1", "t2", "t3") if any(e["status"] == "running" for e in await entries(driver, k))
    }
    assert running == {c.key for c in claimed}
    flaky.fail("find_one_and_update", OperationFailure("BadValue", code=2), times=3)
    with pytest.raises(StorageError):  # nothing claimed at all: the error surfaces
        await driver.claim(claim_params("w2", n=3))
