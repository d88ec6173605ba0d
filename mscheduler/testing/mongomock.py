"""Helpers for tests: an in-memory MongoDB database (mongomock-motor), made to fit PyMongo 4.13+.

``mongomock`` (4.3) predates PyMongo's ``UpdateOne(sort=...)`` (4.11), so PyMongo's bulk
operations pass a ``sort`` argument mongomock does not know; ``mongomock_database`` teaches it to
ignore an empty one, and its ``distinct`` to take (and ignore) a ``hint``. This module needs
the test dependencies (``mongomock-motor``).
"""

from __future__ import annotations

import inspect
from typing import Any


def _patch_bulk_sort() -> None:
    from mongomock.collection import BulkOperationBuilder

    original: Any = BulkOperationBuilder.add_update
    if "sort" in inspect.signature(original).parameters:
        return

    def add_update(self: Any, *args: Any, sort: Any = None, **kwargs: Any) -> Any:
        if sort:
            raise NotImplementedError("mongomock cannot sort inside bulk updates")
        return original(self, *args, **kwargs)

    BulkOperationBuilder.add_update = add_update  # type: ignore[method-assign]


def _patch_distinct_hint() -> None:
    """PyMongo's ``distinct`` takes ``hint`` (4.12); mongomock's does not: it may ignore it."""
    from mongomock.collection import Collection

    original: Any = Collection.distinct
    if "hint" in inspect.signature(original).parameters:
        return

    def distinct(self: Any, key: Any, filter: Any = None, session: Any = None, hint: Any = None) -> Any:
        return original(self, key, filter, session)

    Collection.distinct = distinct  # type: ignore[method-assign]


def mongomock_database(name: str = "mscheduler_test") -> Any:
    """A fresh in-memory async database for ``MongoDriver`` (no change streams, no sessions)."""
    from mongomock_motor import AsyncMongoMockClient

    _patch_bulk_sort()
    _patch_distinct_hint()
    return AsyncMongoMockClient()[name]
