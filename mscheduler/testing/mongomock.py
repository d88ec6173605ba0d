"""Helpers for tests: an in-memory MongoDB database (mongomock-motor), made to fit PyMongo 4.13+.

``mongomock`` (4.3) predates PyMongo's ``UpdateOne(sort=...)`` (4.11), so PyMongo's bulk
operations pass a ``sort`` argument mongomock does not know; ``mongomock_database`` teaches it to
ignore an empty one. This module needs the test dependencies (``mongomock-motor``).
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


def mongomock_database(name: str = "mscheduler_test") -> Any:
    """A fresh in-memory async database for ``MongoDriver`` (no change streams, no sessions)."""
    from mongomock_motor import AsyncMongoMockClient

    _patch_bulk_sort()
    return AsyncMongoMockClient()[name]
