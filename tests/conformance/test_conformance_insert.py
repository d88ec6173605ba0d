"""insert_tasks: idempotent by key (SPEC F1), batches, reset of finished tasks."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from mscheduler.domain.listing import ListParams
from mscheduler.drivers.base import InsertParams, MarkParams
from tests.conformance.support import NAME, Store, stored_option


async def test_a_new_task_is_pending_and_due_at_once(store: Store) -> None:
    assert await store.add("a", params={"n": 1, "tags": ["x", "y"]}) is True
    doc = await store.get("a")
    assert doc["key"] == "a"
    assert doc["name"] == NAME
    assert doc["params"] == {"n": 1, "tags": ["x", "y"]}
    assert doc["option"] == stored_option(store.now, retry_delay=timedelta(0))
    state = doc["state"]
    assert state["status"] == "pending"
    assert state["worker_states"] == []
    assert state["create_time"] == store.now
    assert state["update_time"] == store.now
    assert state["claim_at"] == store.now  # run_at defaults to the send time
    assert (state["free_slots"], state["running_cnt"], state["success_cnt"], state["fail_cnt"]) == (
        1,
        0,
        0,
        0,
    )
    assert state["retry_at"] is None
    assert state["targeted"] is False


async def test_a_second_insert_of_a_key_changes_nothing(store: Store) -> None:
    assert await store.add("a", params={"v": 1}, priority=1) is True
    before = await store.get("a")
    store.advance(5)
    assert await store.add("a", params={"v": 2}, priority=9) is False
    assert await store.get("a") == before
    assert len(await store.all_tasks()) == 1


async def test_a_running_task_is_never_disturbed_by_a_resend(store: Store) -> None:
    await store.add("a", params={"v": 1})
    claimed = await store.claim_one("w1")
    assert claimed is not None
    before = await store.get("a")
    store.advance(1)
    assert await store.insert(store.task("a", params={"v": 2})) == [False]
    assert await store.insert(store.task("a", params={"v": 3}), reset_finished=True) == [False]
    assert await store.get("a") == before
    assert await store.done(claimed, "w1") is True  # the runner's lease is intact
    assert await store.status("a") == "succeeded"


async def test_the_same_key_sent_concurrently_creates_exactly_one_task(store: Store) -> None:
    sends = [
        store.driver.insert_tasks(InsertParams([store.task("same", params={"sender": i})], store.now))
        for i in range(6)
    ]
    results = await asyncio.gather(*sends)
    assert sorted(r[0] for r in results) == [False] * 5 + [True]
    winner = next(i for i, r in enumerate(results) if r[0])
    tasks = await store.all_tasks()
    assert [t["key"] for t in tasks] == ["same"]
    assert tasks[0]["params"] == {"sender": winner}


async def test_a_batch_with_some_existing_keys_reports_each_key(store: Store) -> None:
    assert await store.insert(store.task("a"), store.task("c")) == [True, True]
    batch = [store.task(k, params={"k": k}) for k in ("a", "b", "c", "d")]
    assert await store.insert(*batch) == [False, True, False, True]
    keys = sorted(t["key"] for t in await store.all_tasks())
    assert keys == ["a", "b", "c", "d"]
    assert (await store.get("a"))["params"] is None  # the existing one kept its params
    assert (await store.get("d"))["params"] == {"k": "d"}


async def test_reset_finished_resets_only_succeeded_and_failed_tasks(store: Store) -> None:
    created_at = store.now
    keys = ("pending", "running", "succeeded", "failed")
    for key in keys:  # one name per task, so each claim picks the task it means
        await store.add(key, name=key, params={"v": 1}, max_unexpected_retries=0)
    running = await store.claim_one("w1", names=["running"])
    succeeded = await store.claim_one("w1", names=["succeeded"])
    failed = await store.claim_one("w1", names=["failed"])
    assert running is not None and succeeded is not None and failed is not None
    assert await store.done(succeeded, "w1") is True
    assert await store.fail(failed, "w1") is True
    assert {key: await store.status(key) for key in keys} == {key: key for key in keys}
    before = {key: await store.get(key) for key in keys}

    store.advance(5)  # within the running task's lease
    resend = [store.task(key, name=key, params={"v": 2}, priority=7) for key in keys]
    assert await store.insert(*resend) == [False, False, False, False]  # without the flag: nothing
    assert await store.insert(*resend, reset_finished=True) == [False, False, True, True]

    assert await store.get("pending") == before["pending"]
    assert await store.get("running") == before["running"]
    for key in ("succeeded", "failed"):
        doc = await store.get(key)
        assert doc["params"] == {"v": 2}
        assert doc["option"]["priority"] == 7
        state = doc["state"]
        assert state["status"] == "pending"
        assert state["worker_states"] == []
        assert (state["fail_cnt"], state["success_cnt"], state["free_slots"]) == (0, 0, 1)
        assert state["create_time"] == created_at
        assert state["update_time"] == store.now
        assert state["claim_at"] == store.now
    # a reset task is claimable again, by the worker that succeeded on it before, too
    assert await store.claim_keys("w1", names=["succeeded"]) == ["succeeded"]
    assert await store.claim_keys("w1", names=["failed"]) == ["failed"]
    assert await store.done(running, "w1") is True  # the running one was never disturbed


async def test_reset_finished_resets_a_status_set_by_hand(store: Store) -> None:
    # an operator marked the task failed (or succeeded) by hand: a reset starts it over, as it
    # does a task that ended on its own (the mark ended with the generation; was: reported
    # created while the mark kept the task failed and never claimable)
    for key, status in (("by-hand-failed", "failed"), ("by-hand-succeeded", "succeeded")):
        await store.add(key, name=key, params={"v": 1})
        mark = MarkParams(key, status, statuses=["pending"], now=store.now, reason="ops", by="me")
        assert await store.driver.mark_task(mark) is True
        assert await store.status(key) == status
        store.advance(1)
        assert await store.insert(store.task(key, name=key, params={"v": 2}), reset_finished=True) == [True]
        doc = await store.get(key)
        assert doc["state"]["status"] == "pending" and doc["params"] == {"v": 2}
        assert doc["state"].get("marked") is None
        assert await store.claim_keys("w1", names=[key]) == [key]


async def test_insert_keeps_names_and_lists_in_creation_order(store: Store) -> None:
    await store.add("b", name="first")
    store.advance(timedelta(milliseconds=1).total_seconds())
    await store.add("a", name="second")
    tasks = await store.driver.list_tasks(ListParams())
    assert [(t["key"], t["name"]) for t in tasks] == [("b", "first"), ("a", "second")]


async def test_a_reset_keeps_the_ended_attempts_in_the_history_with_who_reset(store: Store) -> None:
    await store.add("r", params={"v": 1}, max_unexpected_retries=0)
    claimed = await store.claim_one("w1")
    assert claimed is not None and await store.done(claimed, "w1", result="first") is True
    before = (await store.get("r"))["state"]["worker_states"]
    store.advance(1)
    params = InsertParams([store.task("r", params={"v": 2})], store.now, True, None, "api:ops")
    assert await store.driver.insert_tasks(params) == [True]
    await store.check_all()
    state = (await store.get("r"))["state"]
    assert state["worker_states"] == [] and state["generation"] == 1
    assert state["history"] == [
        {
            "generation": 0,
            "restart_time": store.now,
            "worker_states": before,
            "action": "reset",
            "by": "api:ops",
        }
    ]
    # a second reset adds a second record; the first stays as it was
    claimed = await store.claim_one("w1")
    assert claimed is not None and await store.done(claimed, "w1") is True
    store.advance(1)
    again = InsertParams([store.task("r", params={"v": 3})], store.now, True, None, None)
    assert await store.driver.insert_tasks(again) == [True]
    history = (await store.get("r"))["state"]["history"]
    assert [(h["generation"], h["by"], len(h["worker_states"])) for h in history] == [
        (0, "api:ops", 1),
        (1, None, 1),
    ]
