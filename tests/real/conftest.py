"""Fixtures for the real-server tests: a fresh database on MSCHEDULER_TEST_MONGODB_URI, dropped after."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import REAL_URI


@pytest.fixture
async def real_database() -> AsyncIterator[Any]:
    """A PyMongo ``AsyncDatabase`` of its own (``.client`` is its client), dropped afterwards."""
    if not REAL_URI:
        pytest.skip("MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)")
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(REAL_URI)
    database = client[f"mscheduler_real_{uuid.uuid4().hex[:8]}"]
    try:
        yield database
    finally:
        await client.drop_database(database.name)
        await client.close()
