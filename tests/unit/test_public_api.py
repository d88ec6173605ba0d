"""The public surface is deliberate: ``mscheduler``, ``mscheduler.testing`` and ``mscheduler.web``
(``create_app`` and its tokens) are public, each with an exact ``__all__`` a change must change
here; everything else is internal by name, and no module of the package imports another's
``_``-prefixed name (a name two modules share is public in the one that defines it)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import tomllib
from pathlib import Path

import pytest

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
    "Fairness",
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

TESTING = [
    "FakeClock",
    "HandlerRun",
    "KitPublisher",
    "MisplacedTask",
    "SchedulerKit",
    "SkewedClock",
    "mongomock_database",
    "mongos_database",
    "run_handler",
    "scheduler_kit",
]

WEB = ["API", "ApiLimits", "ApiTokens", "Role", "Token", "create_app", "parse_tokens", "read_tokens_file"]

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
    "mscheduler.web.deps.HttpError": "an error answer raised inside the app, answered as its JSON",
    "mscheduler.remote.client.ServerBusy": "a 429 to ExecutorClient: a transient StorageError",
}

REPO = Path(__file__).resolve().parents[2]


def test_all_is_exactly_the_expected_list() -> None:
    assert mscheduler.__all__ == EXPECTED
    assert mscheduler.__all__ == sorted(mscheduler.__all__)
    assert len(set(mscheduler.__all__)) == len(mscheduler.__all__)


@pytest.mark.parametrize(("module", "expected"), [("mscheduler.testing", TESTING), ("mscheduler.web", WEB)])
def test_the_other_public_modules_export_exactly_their_lists(module: str, expected: list[str]) -> None:
    imported = importlib.import_module(module)
    assert imported.__all__ == expected
    namespace: dict[str, object] = {}
    exec(f"from {module} import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(expected)
    for name in expected:
        assert inspect.getdoc(getattr(imported, name)), f"{module}.{name} has no docstring"


def _private_imports(source: str) -> list[str]:
    """``from mscheduler... import _name`` (dunders aside) and imports of ``_``-prefixed modules."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("mscheduler"):
            continue
        module = node.module or ""
        if any(part.startswith("_") and not part.startswith("__") for part in module.split(".")):
            found.append(module)
        found += [
            f"{module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.endswith("__")
        ]
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    found = {
        str(path.relative_to(REPO)): names
        for path in sorted((REPO / "mscheduler").rglob("*.py"))
        if (names := _private_imports(path.read_text()))
    }
    assert not found, f"give these a public name where they are defined: {found}"


def test_the_private_import_check_sees_one() -> None:
    assert _private_imports("from mscheduler.drivers.mongo.common import _helper, __version__") == [
        "mscheduler.drivers.mongo.common._helper"
    ]
    assert _private_imports("from mscheduler.web import _internal") == ["mscheduler.web._internal"]
    assert _private_imports("from os import _exit") == []


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
