"""One operator contract: ``Operations`` and ``RemoteOperations`` have exactly the methods of
``OperatorApi``, each with the same signature (names, kinds, defaults, annotations), so every
CLI command runs unchanged against either. mypy checks the same where the CLI takes one."""

from __future__ import annotations

import inspect

import pytest

from mscheduler import Operations, RemoteOperations
from mscheduler.operations import OperatorApi

# RemoteOperations' own methods beyond the contract: the HTTP connection's.
REMOTE_ONLY = {"connect", "aclose"}


def _public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and name in vars(cls)
    }


CONTRACT = sorted(_public_methods(OperatorApi))


def test_operations_has_exactly_the_contracts_methods() -> None:
    assert _public_methods(Operations) == set(CONTRACT)


def test_remote_operations_has_the_contracts_methods_and_its_connections() -> None:
    assert _public_methods(RemoteOperations) == set(CONTRACT) | REMOTE_ONLY


@pytest.mark.parametrize("implementation", [Operations, RemoteOperations], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", CONTRACT)
def test_every_method_has_the_contracts_signature(implementation: type, name: str) -> None:
    expected = inspect.signature(getattr(OperatorApi, name))
    actual = inspect.signature(getattr(implementation, name))
    assert str(actual) == str(expected), f"{implementation.__name__}.{name}"
    assert inspect.iscoroutinefunction(getattr(implementation, name)), name
