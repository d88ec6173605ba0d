"""The storage forms publishing builds (issue 21 made them cheaper; these hold them to what they
were): an option's stored form, the size of absent params."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import bson

from mscheduler import FixedRetry, TaskOption
from mscheduler.domain import model
from mscheduler.domain.model import encoded_size


def test_absent_params_have_the_bson_size_of_none() -> None:
    assert encoded_size(None) == len(bson.encode({"v": None})) == model._NONE_SIZE


def test_an_options_stored_form_is_fresh_each_time_and_takes_the_run_time() -> None:
    option = TaskOption(specific_worker_ids=("w1", "w2"), specific_groups=("g",), priority=3)
    first = option.to_storage(datetime(2026, 1, 1, tzinfo=UTC))
    second = option.to_storage(datetime(2026, 1, 2, tzinfo=UTC))
    assert first["run_at"] == datetime(2026, 1, 1, tzinfo=UTC)
    assert second["run_at"] == datetime(2026, 1, 2, tzinfo=UTC)
    assert first is not second
    for field in ("specific_worker_ids", "specific_groups", "lost_retry_delays_ms"):
        assert first[field] == second[field]
        assert first[field] is not second[field]  # documents never share a list
    first["specific_worker_ids"].append("w3")
    assert option.to_storage(datetime(2026, 1, 1, tzinfo=UTC))["specific_worker_ids"] == ["w1", "w2"]


def test_an_options_stored_form_is_what_it_was() -> None:
    run_at = datetime(2026, 3, 4, 5, 6, 7, 8000, tzinfo=UTC)
    option = TaskOption(
        retry=FixedRetry(delay=timedelta(seconds=2), max_retries=4),
        run_timeout=timedelta(minutes=1),
        deadline=run_at + timedelta(days=1),
    )
    stored = option.to_storage(datetime(2026, 1, 1, tzinfo=UTC))
    assert list(stored) == [
        "priority",
        "concurrent_worker_cnt",
        "specific_worker_ids",
        "specific_groups",
        "same_worker_may_repeat",
        "ping_interval_ms",
        "worker_timeout_ms",
        "max_unexpected_retries",
        "retry_delay_ms",
        "run_at",
        "retry",
        "lost_retry_delays_ms",
        "deadline",
        "run_timeout_ms",
    ]
    assert stored["run_at"] == datetime(2026, 1, 1, tzinfo=UTC)
    assert stored["retry"] == option.retry.to_storage()  # type: ignore[union-attr]
    assert stored["lost_retry_delays_ms"] == [2000]
    assert stored["run_timeout_ms"] == 60_000
    assert stored["ping_interval_ms"] == 10_000 and stored["worker_timeout_ms"] == 30_000
    assert stored["deadline"] == run_at + timedelta(days=1)
    assert TaskOption.from_storage(stored).model_dump(exclude={"run_at"}) == option.model_dump(
        exclude={"run_at"}
    )


def test_many_options_do_not_pile_up() -> None:
    for priority in range(model._STORED_OPTIONS_MAX + 10):
        TaskOption(priority=priority).to_storage(datetime(2026, 1, 1, tzinfo=UTC))
    assert len(model._STORED_OPTIONS) <= model._STORED_OPTIONS_MAX


async def test_tasks_of_one_batch_share_a_stored_option_and_changing_one_leaves_the_others() -> None:
    from mscheduler import MemoryDriver, OptionChange, Publisher, Task

    driver = MemoryDriver()
    publisher = Publisher(driver)
    option = TaskOption(priority=5, specific_groups=("g",))
    await publisher.send_many(
        [Task(f"t{i}", "job", option=option) for i in range(3)] + [Task("plain", "job")]
    )
    stored = [driver._tasks[f"t{i}"]["option"] for i in range(3)]
    assert stored[0] is stored[1] is stored[2]  # one dict for the batch's tasks of one option
    assert driver._tasks["plain"]["option"] is not stored[0]
    await publisher.update_option("t1", OptionChange(priority=9, specific_groups=("h",)))
    assert (await publisher.get("t1")).option.priority == 9
    for key in ("t0", "t2"):
        info = await publisher.get(key)
        assert info.option.priority == 5 and info.option.specific_groups == ("g",)
    assert (await publisher.get("plain")).option.priority == 0


async def test_tasks_of_one_insert_share_derived_fields_and_a_claim_changes_only_its_own() -> None:
    from mscheduler import MemoryDriver, Publisher, Task
    from mscheduler.drivers.base import ClaimParams

    driver = MemoryDriver()
    await Publisher(driver).send_many([Task(f"t{i}", "job") for i in range(3)])
    states = [driver._tasks[f"t{i}"]["state"] for i in range(3)]
    assert states[0]["claimers"] is states[1]["claimers"] is states[2]["claimers"] == ["job|*"]
    now = driver.clock.now()
    claimed = await driver.claim(ClaimParams("w1", ["job"], now, ["a1"]))
    assert [c.key for c in claimed] == ["t0"]
    assert driver._tasks["t0"]["state"]["status"] == "running"
    for key in ("t1", "t2"):
        state = (await driver.get_task(key))["state"]  # type: ignore[index]
        assert state["status"] == "pending" and state["claimers"] == ["job|*"]
