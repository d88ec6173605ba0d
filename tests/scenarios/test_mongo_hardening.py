"""MongoDriver hardening (issue 6, A5 / A6): one bad document never stops anyone, write-concern
errors are told apart (configuration / not yet on a majority / retryable), on mongomock with the
``FlakyCollection`` of ``test_mongo_retries`` making chosen calls raise PyMongo's own errors.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pymongo.errors import (
    BulkWriteError,
    DocumentTooLarge,
    OperationFailure,
    WriteConcernError,
)

from mscheduler import Consumer, FakeClock, Publisher, Task, TaskStatus
from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.listing import ListParams
from mscheduler.drivers.base import ExpireParams, FinishParams, PingParams
from mscheduler.drivers.mongo.driver import MongoDriver
from tests.helpers import Recorder
from tests.scenarios.harness import advance_until
from tests.scenarios.test_mongo_retries import LEASE, NOW, claim_params, entries, flaky_driver, publish

LATER = NOW + timedelta(seconds=1)

TOO_LARGE = {
    "DocumentTooLarge": lambda: DocumentTooLarge("BSON document too large (16793600 bytes)"),
    "OperationFailure-17419": lambda: OperationFailure(
        "Resulting document after update is larger than 16777216", code=17419
    ),
}
too_large = pytest.mark.parametrize("error", list(TOO_LARGE.values()), ids=list(TOO_LARGE))


async def _task(driver: MongoDriver, key: str) -> dict[str, Any]:
    doc = await driver.get_task(key)
    assert doc is not None
    return doc


async def _claimed_one(driver: MongoDriver, key: str = "t1") -> Any:
    await publish(driver, key)
    (claimed,) = await driver.claim(claim_params())
    assert claimed.key == key
    return claimed


# -- A5: an outcome the task's document cannot hold ---------------------------------------------


@too_large
async def test_finish_of_an_outcome_too_large_fails_the_attempt_with_the_reason(error: Any) -> None:
    driver, flaky = await flaky_driver()
    claimed = await _claimed_one(driver)
    # the batch write and the single write of the read-back both meet the too-large document
    flaky.fail("update_one", error(), times=2)
    finish = FinishParams("t1", "w1", claimed.attempt, LATER, "succeeded", result={"blob": "x" * 100})
    assert await driver.finish([finish]) == [True], "no exception escapes; the fallback landed"
    assert flaky.planned("update_one") == 0
    (entry,) = await entries(driver, "t1")
    assert entry["status"] == "rejected"
    assert entry["result"] is None
    assert entry["error"]["type"] == "OutcomeTooLarge"
    assert "cannot be stored" in entry["error"]["message"]
    info = await Publisher(driver).get("t1")
    assert info.status is TaskStatus.FAILED, "a rejected attempt fails the task (no retry)"
    assert info.last_error is not None and info.last_error.type == "OutcomeTooLarge"


async def test_an_outcome_too_large_in_a_batch_does_not_fail_the_others() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1", "t2")
    claimed = {c.key: c for c in await driver.claim(claim_params(n=2))}
    assert set(claimed) == {"t1", "t2"}
    flaky.fail("bulk_write", DocumentTooLarge("too large"))
    flaky.fail("update_one", DocumentTooLarge("too large"))  # the first single write: t1's
    batch = [
        FinishParams("t1", "w1", claimed["t1"].attempt, LATER, "succeeded", result="huge"),
        FinishParams("t2", "w1", claimed["t2"].attempt, LATER, "succeeded", result="small"),
    ]
    assert await driver.finish(batch) == [True, True]
    (t1,) = await entries(driver, "t1")
    (t2,) = await entries(driver, "t2")
    assert (t1["status"], t1["error"]["type"]) == ("rejected", "OutcomeTooLarge")
    assert (t2["status"], t2["result"]) == ("succeeded", "small")


async def test_an_outcome_whose_failure_cannot_be_stored_either_marks_the_task_broken() -> None:
    driver, flaky = await flaky_driver()
    claimed = await _claimed_one(driver)
    flaky.fail("update_one", DocumentTooLarge("too large"), times=3)  # batch, single, fallback
    finish = FinishParams("t1", "w1", claimed.attempt, LATER, "succeeded", result="x")
    assert await driver.finish([finish]) == [False], "nothing of the attempt could be written"
    doc = await _task(driver, "t1")
    assert doc["state"]["broken"]["type"] == "TaskDocumentError"
    assert doc["state"]["claim_at"] is None, "never claimed again"
    # its attempt still holds a lease (nothing of it could be written): failed once that ends
    assert doc["state"]["status"] == "running"
    assert await driver.expire_leases(ExpireParams(NOW + LEASE * 2)) == 1
    assert (await _task(driver, "t1"))["state"]["status"] == "failed"
    assert await driver.claim(claim_params("w2")) == []


# -- A5: a task that cannot take another worker entry --------------------------------------------


def _accept_find_hints(flaky: Any) -> None:
    """A real server takes ``hint`` on a find (mongomock's ``find_one`` refuses it): drop it."""
    find_one = flaky.find_one

    async def find_one_without_hint(*args: Any, hint: Any = None, **kwargs: Any) -> Any:
        return await find_one(*args, **kwargs)

    flaky.find_one = find_one_without_hint


async def _claim_meets_a_document_error(*, real_server_hints: bool) -> None:
    driver, flaky = await flaky_driver()
    if real_server_hints:
        _accept_find_hints(flaky)
    await publish(driver, "big", priority=5)  # claimed first
    await publish(driver, "t2")
    # the task fails every claim (its document is too large): the claim, then the claim of the
    # head alone that tells which task it is (issue 17 C.14)
    flaky.fail(
        "find_one_and_update",
        OperationFailure("Resulting document after update is larger than 16777216", code=17419),
        times=2,
    )
    assert await driver.claim(claim_params()) == [], "no exception escapes"
    assert flaky.calls["find_one_and_update"] == 2, "not retried: tried once more on the head alone"
    big = await _task(driver, "big")
    assert big["state"]["broken"]["type"] == "TaskDocumentError"
    assert "larger than" in big["state"]["broken"]["message"]
    assert big["state"]["status"] == "failed"
    assert big["state"]["worker_states"] == []
    # the reason reaches readers: TaskInfo.last_error, and so wait()'s TaskFailed
    from mscheduler.domain.model import TaskInfo

    info = TaskInfo.from_storage(big)
    assert info.last_error is not None and info.last_error.type == "TaskDocumentError"
    # the next claim takes another task, and the broken one is never offered again
    (claimed,) = await driver.claim(claim_params("w2"))
    assert claimed.key == "t2"
    assert await driver.claim(claim_params("w3")) == []
    counts = await driver.count_by_status()
    assert counts.get("failed") == 1 and counts.get("running") == 1


async def test_a_claim_meeting_a_document_error_marks_that_task_broken_and_carries_on() -> None:
    await _claim_meets_a_document_error(real_server_hints=True)


async def test_a_claim_meeting_a_document_error_on_plain_mongomock() -> None:
    await _claim_meets_a_document_error(real_server_hints=False)


# -- A5 / A6: configuration errors are told apart and never retried --------------------------------

CONFIG = {
    "Unauthorized-13": lambda: OperationFailure("not authorized on db to execute command", code=13),
    "WriteConcernError-79": lambda: WriteConcernError("UnknownReplWriteConcern", code=79, details={}),
    "WriteConcernError-100": lambda: WriteConcernError("UnsatisfiableWriteConcern", code=100, details={}),
}
config_errors = pytest.mark.parametrize("error", list(CONFIG.values()), ids=list(CONFIG))


@config_errors
async def test_a_configuration_error_on_a_claim_is_not_retried(error: Any) -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    flaky.fail("find_one_and_update", error())
    with pytest.raises(StorageError) as info:
        await driver.claim(claim_params())
    assert info.value.config and not info.value.transient and not info.value.document
    assert flaky.calls["find_one_and_update"] == 1, "not retried"
    assert flaky.calls["find_one"] == 0, "no recovery read: the error says what happened"


@config_errors
async def test_a_configuration_error_on_finish_and_ping_is_not_retried(error: Any) -> None:
    driver, flaky = await flaky_driver()
    claimed = await _claimed_one(driver)
    before = flaky.calls["update_one"]
    flaky.fail("update_one", error())
    with pytest.raises(StorageError) as info:
        await driver.finish([FinishParams("t1", "w1", claimed.attempt, LATER, "succeeded", result=1)])
    assert info.value.config
    assert flaky.calls["update_one"] == before + 1
    before_many = flaky.calls["update_many"]
    flaky.fail("update_many", error())
    with pytest.raises(StorageError) as info:
        await driver.ping(PingParams("w1", LATER, {NOW + LEASE * 2: {"t1": claimed.attempt}}))
    assert info.value.config
    assert flaky.calls["update_many"] == before_many + 1
    (entry,) = await entries(driver, "t1")
    assert entry["status"] == "running"


async def test_an_unauthorized_insert_is_a_configuration_error() -> None:
    driver, flaky = await flaky_driver()
    flaky.fail("insert_many", OperationFailure("not authorized", code=13))
    with pytest.raises(StorageError) as info:
        await Publisher(driver).send(Task("t1", "job"))
    assert info.value.config
    assert flaky.calls["insert_many"] == 1


# -- A6: wtimeout (64): applied on the primary, not yet on a majority ------------------------------


async def test_a_claim_applied_whose_write_concern_timed_out_is_recovered_not_sent_twice() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1", "t2")
    flaky.fail(
        "find_one_and_update",
        WriteConcernError("waiting for replication timed out", code=64, details={}),
        after_apply=True,
    )
    claimed = await driver.claim(claim_params())
    assert [c.key for c in claimed] == ["t1"]
    assert flaky.calls["find_one_and_update"] == 1, "not sent again: the read-back found it"
    assert flaky.calls["find"] == 1, "one recovery read, by the attempt token"
    (entry,) = await entries(driver, "t1")
    assert (entry["attempt"], entry["status"]) == (claimed[0].attempt, "running")
    assert await entries(driver, "t2") == []


async def test_a_write_concern_timeout_whose_write_is_not_found_is_an_unknown_outcome() -> None:
    driver, flaky = await flaky_driver()
    await publish(driver, "t1")
    flaky.fail("find_one_and_update", WriteConcernError("wtimeout", code=64, details={}))
    with pytest.raises(StorageError) as info:
        await driver.claim(claim_params())
    assert info.value.transient and not info.value.config
    assert "outcome unknown" in str(info.value)
    assert flaky.calls["find_one_and_update"] == 1, "not retried: it would wait again"


async def test_a_bulk_insert_with_only_write_concern_errors_is_a_success() -> None:
    driver, flaky = await flaky_driver()
    details = {
        "writeErrors": [],
        "writeConcernErrors": [{"code": 64, "errmsg": "waiting for replication timed out"}],
        "nInserted": 1,
    }
    flaky.fail("insert_many", BulkWriteError(details), after_apply=True)
    assert await Publisher(driver).send(Task("t1", "job")) is True
    assert flaky.calls["insert_many"] == 1, "not retried"
    assert [t["key"] for t in await driver.list_tasks(ListParams())] == ["t1"]


async def test_a_bulk_insert_with_a_configuration_write_concern_error_is_refused() -> None:
    driver, flaky = await flaky_driver()
    details = {"writeErrors": [], "writeConcernErrors": [{"code": 100, "errmsg": "unsatisfiable"}]}
    flaky.fail("insert_many", BulkWriteError(details))
    with pytest.raises(StorageError) as info:
        await Publisher(driver).send(Task("t1", "job"))
    assert info.value.config
    assert flaky.calls["insert_many"] == 1


# -- through a consumer: the finisher survives an outcome too large -------------------------------


async def test_a_consumer_survives_an_outcome_too_large_and_runs_the_next_task() -> None:
    driver, flaky = await flaky_driver()
    clock = FakeClock(NOW)
    consumer = Consumer(driver, worker_id="w", clock=clock, poll_interval=1.0, concurrency=1)
    release = asyncio.Event()

    async def work(params: Any) -> str:
        await release.wait()
        return str(params["key"])

    consumer.register("job", work)
    recorder = Recorder(consumer)
    await publish(driver, "t1")
    async with consumer:
        await recorder.wait("claimed", 1)  # the claim (and, on the fake, its first-lease fix-up)
        flaky.fail("update_one", DocumentTooLarge("too large"), times=2)
        release.set()
        await recorder.wait("finished", 1)
        assert flaky.planned("update_one") == 0
        assert consumer.state == "running" and consumer.error is None
        await publish(driver, "t2")
        await advance_until(clock, lambda: recorder.counts["finished"] >= 2, limit=10)
    (t1,) = await entries(driver, "t1")
    assert (t1["status"], t1["error"]["type"]) == ("rejected", "OutcomeTooLarge")
    assert [(e["status"], e["result"]) for e in await entries(driver, "t2")] == [("succeeded", "t2")]
    assert consumer.stop_reason == "requested"
