"""The public API is deliberate (STYLE 13): a change to ``mscheduler.__all__`` must change this test."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import tomllib
from pathlib import Path

import mscheduler

EXPECTED = [
    "ApiError",
    "ApiRefused",
    "ApiUnreachable",
    "App",
    "AtSchedule",
    "AttemptStatus",
    "CatchUp",
    "Child",
    "Consumer",
    "ConsumerStopped",
    "CronSchedule",
    "Driver",
    "ErrorInfo",
    "Event",
    "EventKind",
    "Events",
    "EverySchedule",
    "ExecutorClient",
    "ExpiryService",
    "ExponentialRetry",
    "Fail",
    "FakeClock",
    "FixedRetry",
    "FixedThenExponentialRetry",
    "HandlerSignal",
    "InvalidInput",
    "Jitter",
    "KeyTaken",
    "LeaseLost",
    "LimitInfo",
    "ListParams",
    "MSchedulerError",
    "MemoryDriver",
    "MongoDriver",
    "MonthlySchedule",
    "NotAnApi",
    "Operations",
    "OptionChange",
    "PerDayRetry",
    "Plan",
    "PlanInfo",
    "PlanState",
    "PlanTiming",
    "Planner",
    "Publisher",
    "Rate",
    "RemoteExecutors",
    "RemoteOperations",
    "RemoteTask",
    "Retention",
    "RetentionService",
    "Retry",
    "RetryPolicy",
    "Schedule",
    "Snooze",
    "StepInfo",
    "StorageError",
    "SyncPublisher",
    "SyncTaskContext",
    "Task",
    "TaskCancelled",
    "TaskContext",
    "TaskExpired",
    "TaskFailed",
    "TaskInfo",
    "TaskOption",
    "TaskStatus",
    "TransitionRefused",
    "UnknownLimit",
    "UnknownPlan",
    "UnknownTask",
    "WeeklySchedule",
    "WorkerState",
    "WorkerView",
    "WorkflowInfo",
]

# Exceptions defined in the package that users never catch, with the reason.
INTERNAL_EXCEPTIONS = {
    "mscheduler.cli.common.CliError": "the command line's own message-and-exit-code carrier",
    "mscheduler.cli.demo.DemoFailure": "the demo's handlers raise it on purpose (retry paths)",
    "mscheduler.drivers.base.ChangeStreamUnsupported": "driver to consumer: fall back to polling",
    "mscheduler.drivers.base.ResumeTokenLost": "driver to consumer: reopen the stream and poll once",
    "mscheduler.drivers.base.UniqueParamsTaken": "driver to Operations: raised as TransitionRefused",
    "mscheduler.drivers.base.LimitNameTaken": "driver to Operations: raised as InvalidInput",
    "mscheduler.drivers.mongo.common.WriteMayRollBack": "inside the Mongo driver: a write sent again",
    "mscheduler.testing.faults.DriverKilled": "fault injection in tests: simulates a killed process",
    "mscheduler.testing.mongos.MisplacedTask": "the mongos stand-in refusing a write, as a server WriteError",
    "mscheduler.runtime.consumer.runner.RunTimedOut": "an attempt's error type, never raised to users",
    "mscheduler.web.guards.BodyTooLarge": "the body cap's signal inside the app, answered as a 413",
    "mscheduler.remote.client.ServerBusy": "a 429 to ExecutorClient: a transient StorageError",
}

REPO = Path(__file__).resolve().parents[2]


def test_all_is_exactly_the_expected_list() -> None:
    assert mscheduler.__all__ == EXPECTED
    assert mscheduler.__all__ == sorted(mscheduler.__all__)
    assert len(set(mscheduler.__all__)) == len(mscheduler.__all__)


def test_every_public_name_is_importable_and_documented() -> None:
    module = importlib.import_module("mscheduler")
    for name in EXPECTED:
        obj = getattr(module, name)
        assert obj is not None, name
        exec(f"from mscheduler import {name}", {})
        assert inspect.getdoc(obj), f"{name} has no docstring"


def test_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from mscheduler import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(EXPECTED)


def test_no_private_names_are_exported() -> None:
    for name in mscheduler.__all__:
        assert not name.startswith("_"), name
        obj = getattr(mscheduler, name)
        module = obj.__module__
        assert module.startswith("mscheduler."), (name, module)
        assert not any(part.startswith("_") for part in module.split(".")), (name, module)


def _package_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(mscheduler.__path__, "mscheduler."):
        if info.name == "mscheduler.__main__":
            continue  # runs the command line when imported
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
                and not name.startswith("_")
            ):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_public_exception_is_exported() -> None:
    exceptions = _package_exceptions()
    assert "mscheduler.domain.exceptions.InvalidInput" in exceptions  # the walk found something
    missing = [
        path
        for path, cls in exceptions.items()
        if path not in INTERNAL_EXCEPTIONS and getattr(mscheduler, cls.__name__, None) is not cls
    ]
    assert not missing, f"public exceptions missing from mscheduler.__all__: {missing}"
    for path in INTERNAL_EXCEPTIONS:
        assert path in exceptions, f"{path} is gone: drop it from INTERNAL_EXCEPTIONS"


def test_public_errors_share_one_root() -> None:
    exported = [getattr(mscheduler, n) for n in EXPECTED]
    errors = [obj for obj in exported if inspect.isclass(obj) and issubclass(obj, BaseException)]
    assert len(errors) >= 7
    for cls in errors:
        assert issubclass(cls, mscheduler.MSchedulerError), cls
    assert issubclass(mscheduler.InvalidInput, ValueError)
    assert issubclass(mscheduler.UnknownTask, LookupError)


def test_the_package_has_a_version_matching_pyproject() -> None:
    assert isinstance(mscheduler.__version__, str)
    assert mscheduler.__version__.count(".") == 2
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and pyproject["project"]["dynamic"] == ["version"]
    source = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert source == "mscheduler.domain.version.__version__"  # the one place it is written
    from importlib.metadata import version

    assert version("mscheduler") == mscheduler.__version__  # what the installed metadata says


def test_the_package_ships_type_information() -> None:
    package = Path(mscheduler.__file__).parent
    assert (package / "py.typed").is_file()
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["mscheduler"]
