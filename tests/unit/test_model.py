"""Validation of what users send: Task, TaskOption, OptionChange; bad input writes nothing."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from mscheduler import (
    FakeClock,
    InvalidInput,
    OptionChange,
    Publisher,
    Task,
    TaskInfo,
    TaskOption,
    TaskStatus,
)
from mscheduler.domain.listing import ListParams
from mscheduler.domain.model import KEY_MAX_LEN, PARAMS_MAX_DEPTH, AttemptStatus, check_params
from mscheduler.drivers.base import Driver

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _error_text(exc: pytest.ExceptionInfo[BaseException]) -> str:
    return str(exc.value)


# -- Task: key, name, params ----------------------------------------------------------------------


def test_a_valid_task_keeps_its_fields() -> None:
    task = Task("order-1", "send_email", {"to": "a@example.com", "n": [1, 2.5, None, True]})
    assert (task.key, task.name) == ("order-1", "send_email")
    assert task.params == {"to": "a@example.com", "n": [1, 2.5, None, True]}
    assert task.option == TaskOption()


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "non-empty string"),
        ("x" * (KEY_MAX_LEN + 1), f"longer than {KEY_MAX_LEN}"),
        ("a\x00b", "NUL"),
        ("a\nb", "control characters"),
        ("a\rb", "control characters"),
        ("tab\there", "control characters"),
        ("esc\x1b[2J", "control characters"),
        ("del\x7f", "control characters"),
        ("c1\x85", "control characters"),
    ],
)
def test_bad_keys_are_refused(key: str, message: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        Task(key, "job")
    assert message in _error_text(exc)


def test_a_key_of_the_maximum_length_is_fine() -> None:
    assert Task("k" * KEY_MAX_LEN, "job").key == "k" * KEY_MAX_LEN


def test_a_non_string_key_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"invalid task: key: Input should be a valid string$"):
        Task(123, "job")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "1job", "a b", "$where", "job/x", "x" * 201, "job\n"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        Task("k", name)
    assert "invalid task name" in _error_text(exc)


@pytest.mark.parametrize("name", ["job", "_private", "mail.send", "a:b-c_d.9", "x" * 200])
def test_good_names_are_accepted(name: str) -> None:
    assert Task("k", name).name == name


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"$gt": ""}, "key '$gt' in params must not start with '$'"),
        ({"a.b": 1}, "contain '.'"),
        ({"ok": [{"deep": {"$in": [1]}}]}, "key '$in' in params['ok'][0]['deep'] must not start with '$'"),
        ({"nul\x00": 1}, "in params must not"),
        ({1: "x"}, "key 1 in params must be a string"),
        ({"x": math.nan}, "NaN or infinity at params['x']"),
        ({"x": [math.inf]}, "NaN or infinity at params['x'][0]"),
        ({"x": 2**63}, "integer at params['x'] must fit in 64 bits"),
        ({"x": {1, 2}}, "value of type set at params['x'] cannot be stored"),
        ({"x": object()}, "cannot be stored"),
        ({"x": b"bytes"}, "cannot be stored"),
        ({"when": datetime(2030, 1, 1)}, "datetime at params['when'] must be timezone-aware"),
    ],
)
def test_bad_params_are_refused(params: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        Task("k", "job", params)
    assert _error_text(exc).startswith("invalid task 'k': ")
    assert message in _error_text(exc)


def test_params_nested_too_deep_are_refused() -> None:
    deep: Any = 1
    for _ in range(PARAMS_MAX_DEPTH + 1):
        deep = {"d": deep}
    with pytest.raises(InvalidInput) as exc:
        Task("k", "job", deep)
    assert "nested deeper" in _error_text(exc)
    shallow: Any = 1
    for _ in range(PARAMS_MAX_DEPTH):
        shallow = {"d": shallow}
    assert Task("k", "job", shallow).params == shallow


def test_params_strings_that_look_like_operators_are_plain_data() -> None:
    params = {"q": "$gt", "list": ["$where", {"k": "$$NOW"}], "big": 2**63 - 1, "neg": -(2**63) + 1}
    assert Task("k", "job", params).params == params


def test_params_tuples_become_lists_and_datetimes_utc_milliseconds() -> None:
    local = datetime(2030, 1, 1, 2, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    task = Task("k", "job", {"t": (1, 2), "when": local})
    assert task.params == {"t": [1, 2], "when": datetime(2030, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)}
    assert task.params["when"].utcoffset() == timedelta(0)


def test_pydantic_params_are_stored_as_json() -> None:
    class Order(BaseModel):
        id: int
        at: datetime

    task = Task("k", "job", Order(id=3, at=T0))
    assert task.params == {"id": 3, "at": "2030-01-01T00:00:00Z"}


def test_tasks_are_frozen_and_refuse_unknown_fields() -> None:
    task = Task("k", "job")
    with pytest.raises(ValidationError):
        task.key = "other"  # type: ignore[misc]
    with pytest.raises(
        InvalidInput, match="unknown field 'priority' \\(the fields are key, name, params, option, "
    ):
        Task("k", "job", None, priority=3)


# -- one error tree: constructors raise InvalidInput naming the field -------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Task("k", "job", option={"priority": "high"}), "invalid task 'k': option: "),
        (lambda: Task("", "job"), "invalid task: key must be a non-empty string"),
        (lambda: Task("k", "job", {"a": [1, {"$x": 1}]}), "key '$x' in params['a'][1] must not start"),
        (lambda: TaskOption(retry_delay="soon"), "invalid TaskOption: retry_delay: Input should be"),
        (lambda: OptionChange(run_at="soon"), "invalid OptionChange: run_at: Input should be"),
    ],
)
def test_constructors_raise_invalid_input_naming_the_field(build: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        build()
    assert message in _error_text(exc)
    assert isinstance(exc.value, ValueError)  # InvalidInput stays a ValueError
    assert isinstance(exc.value.__cause__, ValidationError)  # pydantic's details, for who wants them


def test_every_refused_field_is_named_at_once() -> None:
    with pytest.raises(InvalidInput) as exc:
        TaskOption(priority=10**9, max_unexpected_retries=-1)
    text = _error_text(exc)
    assert "priority: Input should be less than or equal to 1000000" in text
    assert "max_unexpected_retries: Input should be greater than or equal to 0" in text


def test_a_long_refused_value_is_shortened_in_the_message() -> None:
    with pytest.raises(InvalidInput) as exc:
        TaskOption(priority="x" * 500)
    assert len(_error_text(exc)) < 200


def test_check_params_names_the_whole_value_it_checks() -> None:
    with pytest.raises(ValueError, match=r"value of type set at result\['items'\]\[2\] cannot be stored"):
        check_params({"items": [1, 2, {3}]}, path="result")


def test_check_params_accepts_none_and_scalars() -> None:
    for value in (None, True, 0, -1, 1.5, "s"):
        assert check_params(value) == value


# -- TaskOption -------------------------------------------------------------------------------------


def test_option_defaults() -> None:
    option = TaskOption()
    assert option.priority == 0
    assert option.concurrent_worker_cnt == 1
    assert option.specific_worker_ids == ()
    assert option.ping_interval == timedelta(seconds=10)
    assert option.worker_timeout == timedelta(seconds=30)
    assert option.max_unexpected_retries == 3
    assert option.retry_delay == timedelta(seconds=10)
    assert option.run_at is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"worker_timeout": timedelta(seconds=10), "ping_interval": timedelta(seconds=10)},
            "longer than ping_interval",
        ),
        (
            {"worker_timeout": timedelta(seconds=5), "ping_interval": timedelta(seconds=10)},
            "longer than ping_interval",
        ),
        ({"ping_interval": timedelta(0)}, "ping_interval must be positive"),
        ({"ping_interval": timedelta(seconds=-1)}, "between 0 and 366 days"),
        ({"retry_delay": timedelta(seconds=-1)}, "between 0 and 366 days"),
        ({"worker_timeout": timedelta(days=367)}, "between 0 and 366 days"),
        ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"priority": 1_000_001}, "priority: Input should be less than or equal to 1000000"),
        ({"priority": -1_000_001}, "priority: Input should be greater than or equal"),
        ({"priority": "high"}, "priority: Input should be a valid integer"),
        ({"concurrent_worker_cnt": 0}, "concurrent_worker_cnt: Input should be greater than or equal"),
        ({"max_unexpected_retries": -1}, "max_unexpected_retries: Input should be greater than or equal"),
        ({"specific_worker_ids": ("",)}, "specific_worker_ids: invalid worker id"),
        ({"specific_worker_ids": ("$w",)}, "invalid worker id"),
        ({"specific_worker_ids": ("w" * 201,)}, "invalid worker id"),
        ({"unknown": 1}, "unknown field 'unknown' (the fields are priority, concurrent_worker_cnt,"),
        (
            {"specific_worker_ids": ("w1", "w2"), "concurrent_worker_cnt": 3},
            "more than the 2 specific_worker_ids",
        ),
    ],
)
def test_bad_options_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        TaskOption(**fields)
    assert _error_text(exc).startswith("invalid TaskOption: ")
    assert message in _error_text(exc)
    assert isinstance(exc.value, ValueError)
    assert not isinstance(exc.value, ValidationError)


def test_worker_ids_keep_their_order_without_duplicates() -> None:
    assert TaskOption(specific_worker_ids=("b", "a", "b", "c", "a")).specific_worker_ids == ("b", "a", "c")


def test_run_at_is_kept_as_utc_milliseconds() -> None:
    local = datetime(2030, 6, 1, 12, 0, 0, 999999, tzinfo=timezone(timedelta(hours=-5)))
    run_at = TaskOption(run_at=local).run_at
    assert run_at == datetime(2030, 6, 1, 17, 0, 0, 999000, tzinfo=UTC)
    assert run_at is not None and run_at.utcoffset() == timedelta(0)


def test_option_storage_round_trip() -> None:
    option = TaskOption(
        priority=5,
        concurrent_worker_cnt=2,
        specific_worker_ids=("w1", "w2"),
        ping_interval=timedelta(seconds=2),
        worker_timeout=timedelta(seconds=7, milliseconds=500),
        max_unexpected_retries=0,
        retry_delay=timedelta(minutes=1),
        run_at=T0,
    )
    stored = option.to_storage(default_run_at=T0 + timedelta(hours=1))
    assert stored == {
        "priority": 5,
        "concurrent_worker_cnt": 2,
        "specific_worker_ids": ["w1", "w2"],
        "specific_groups": [],
        "same_worker_may_repeat": False,
        "ping_interval_ms": 2000,
        "worker_timeout_ms": 7500,
        "max_unexpected_retries": 0,
        "retry_delay_ms": 60000,
        "run_at": T0,
        "retry": None,  # the fixed shorthand: retry_delay x max_unexpected_retries
        "lost_retry_delays_ms": [60000],  # a constant tail is stored once
        "deadline": None,
        "run_timeout_ms": None,
    }
    assert TaskOption.from_storage(stored) == option


def test_run_at_defaults_to_the_send_time_in_storage() -> None:
    assert TaskOption().to_storage(default_run_at=T0)["run_at"] == T0


# -- OptionChange -----------------------------------------------------------------------------------


def test_an_option_change_merges_only_the_given_fields() -> None:
    current = TaskOption(priority=1, specific_worker_ids=("w1",), max_unexpected_retries=4)
    merged = OptionChange(priority=9, specific_worker_ids=()).apply(current)
    assert merged == TaskOption(priority=9, specific_worker_ids=(), max_unexpected_retries=4)


def test_an_option_change_is_validated_as_a_whole() -> None:
    current = TaskOption(ping_interval=timedelta(seconds=10), worker_timeout=timedelta(seconds=30))
    with pytest.raises(InvalidInput, match="longer than ping_interval"):
        OptionChange(worker_timeout=timedelta(seconds=5)).apply(current)
    with pytest.raises(InvalidInput, match="timezone-aware"):
        OptionChange(run_at=datetime(2030, 1, 1)).apply(current)


def test_an_option_change_cannot_change_the_worker_count() -> None:
    with pytest.raises(InvalidInput, match="invalid OptionChange: unknown field 'concurrent_worker_cnt'"):
        OptionChange(concurrent_worker_cnt=2)  # type: ignore[call-arg]
    with pytest.raises(InvalidInput, match="invalid OptionChange: priority: Input should be less than"):
        OptionChange(priority=10**7)


# -- TaskInfo ---------------------------------------------------------------------------------------


def test_task_info_reads_results_and_the_last_error() -> None:
    entry = {
        "worker_id": "w1",
        "attempt": "a1",
        "host": None,
        "pid": None,
        "start_time": T0,
        "ping_expire_time": T0,
        "end_time": T0,
        "retry_at": None,
    }
    doc = {
        "key": "k",
        "name": "job",
        "params": None,
        "option": TaskOption(concurrent_worker_cnt=2).to_storage(T0),
        "state": {
            "create_time": T0,
            "update_time": T0,
            "status": "succeeded",
            "claim_at": None,
            "success_cnt": 2,
            "fail_cnt": 1,
            "running_cnt": 0,
            "worker_states": [
                entry | {"status": "succeeded", "result": 1, "error": None},
                entry | {"status": "failed", "result": None, "error": {"type": "E", "message": "m"}},
                entry | {"status": "succeeded", "result": {"r": 2}, "error": None},
            ],
        },
    }
    info = TaskInfo.from_storage(doc)
    assert info.status is TaskStatus.SUCCEEDED
    assert info.results == [1, {"r": 2}]
    assert info.last_error is not None and (info.last_error.type, info.last_error.message) == ("E", "m")
    assert [w.status for w in info.worker_states] == [
        AttemptStatus.SUCCEEDED,
        AttemptStatus.FAILED,
        AttemptStatus.SUCCEEDED,
    ]


# -- bad input through the Publisher writes nothing (every driver) -------------------------------


async def _keys(driver: Driver) -> list[str]:
    return [t["key"] for t in await driver.list_tasks(ListParams())]


async def test_sending_something_that_is_not_a_task_writes_nothing(
    driver: Driver, fake_clock: FakeClock
) -> None:
    publisher = Publisher(driver, clock=fake_clock)
    with pytest.raises(InvalidInput, match="takes a Task"):
        await publisher.send({"key": "k", "name": "job"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="takes Tasks, got str at index 1"):
        await publisher.send_many([Task("ok", "job"), "not a task"])  # type: ignore[list-item]
    assert await _keys(driver) == []


async def test_send_many_with_a_repeated_key_writes_nothing(driver: Driver, fake_clock: FakeClock) -> None:
    publisher = Publisher(driver, clock=fake_clock)
    with pytest.raises(InvalidInput, match="send_many got the key 'a' twice"):
        await publisher.send_many([Task("a", "job"), Task("b", "job"), Task("a", "job")])
    assert await _keys(driver) == []
    assert await publisher.send_many([Task("a", "job"), Task("b", "job")]) == [True, True]
    assert await publisher.send_many([Task("b", "job"), Task("c", "job")]) == [False, True]
    assert await _keys(driver) == ["a", "b", "c"]


async def test_an_invalid_option_change_writes_nothing(driver: Driver, fake_clock: FakeClock) -> None:
    publisher = Publisher(driver, clock=fake_clock)
    assert await publisher.send(Task("a", "job", option=TaskOption(priority=1))) is True
    before = await driver.get_task("a")
    fake_clock.advance(1)
    with pytest.raises(InvalidInput, match="invalid option change for 'a'"):
        await publisher.update_option("a", OptionChange(worker_timeout=timedelta(seconds=1)))
    assert await driver.get_task("a") == before
    option = await publisher.update_option("a", OptionChange(priority=3))
    assert option.priority == 3
    assert (await publisher.get("a")).option.priority == 3


async def test_reading_with_a_bad_key_is_invalid_input(driver: Driver, fake_clock: FakeClock) -> None:
    publisher = Publisher(driver, clock=fake_clock)
    with pytest.raises(InvalidInput, match="non-empty"):
        await publisher.get("")
    with pytest.raises(InvalidInput):
        await publisher.update_option("", OptionChange(priority=1))
    assert await _keys(driver) == []


async def test_a_resent_key_reports_false_through_the_publisher(
    driver: Driver, fake_clock: FakeClock
) -> None:
    publisher = Publisher(driver, clock=fake_clock)
    assert await publisher.send(Task("a", "job", {"v": 1})) is True
    assert await publisher.send(Task("a", "job", {"v": 2})) is False
    info = await publisher.get("a")
    assert (info.params, info.status) == ({"v": 1}, TaskStatus.PENDING)


@pytest.mark.parametrize(
    "data",
    [{"name": "job"}, {"key": "k"}, {"key": "k", "name": "job", "children": [{"params": {}}]}],
    ids=["no key", "no name", "a child without a name"],
)
def test_a_task_from_json_missing_a_field_is_refused_by_the_model(data: dict[str, Any]) -> None:
    """An API body is validated by calling the model's own __init__: a missing field is the
    model's refusal naming it, never a TypeError (a 500)."""
    with pytest.raises(ValidationError, match="Field required"):
        Task.model_validate(data)
