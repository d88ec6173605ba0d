"""The public API is deliberate (STYLE 13): a change to ``mscheduler.__all__`` must change this test."""

from __future__ import annotations

import importlib
import inspect

import mscheduler

EXPECTED = [
    "Consumer",
    "FakeClock",
    "InvalidInput",
    "MSchedulerError",
    "MemoryDriver",
    "MongoDriver",
    "OptionChange",
    "Publisher",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskInfo",
    "TaskOption",
    "TaskStatus",
    "UnknownTask",
]


def test_all_is_exactly_the_expected_list() -> None:
    assert mscheduler.__all__ == EXPECTED
    assert len(set(mscheduler.__all__)) == len(mscheduler.__all__)


def test_every_public_name_is_importable_and_documented() -> None:
    module = importlib.import_module("mscheduler")
    for name in EXPECTED:
        obj = getattr(module, name)
        assert obj is not None, name
        exec(f"from mscheduler import {name}", {})
        assert inspect.getdoc(obj), f"{name} has no docstring"


def test_public_errors_share_one_root() -> None:
    for name in ("InvalidInput", "TaskFailed", "UnknownTask"):
        assert issubclass(getattr(mscheduler, name), mscheduler.MSchedulerError), name
    assert issubclass(mscheduler.InvalidInput, ValueError)
    assert issubclass(mscheduler.UnknownTask, LookupError)


def test_the_package_has_a_version() -> None:
    assert isinstance(mscheduler.__version__, str)
    assert mscheduler.__version__.count(".") == 2
