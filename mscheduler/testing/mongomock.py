"""An in-memory MongoDB for ``MongoDriver`` in tests: mongomock-motor, patched to follow the server.

``mongomock_database()`` is a fresh database of a fresh in-memory client (one node: no change
streams, no sessions). ``MongoDriver`` runs on it unchanged, as on a server: build the store
first (``await driver.setup()``, what ``mscheduler setup`` does), or give the driver
``create_indexes=True`` so that its ``prepare()`` does.

mongomock lacks some of what the driver sends (date arithmetic in pipelines, ``$reduce``, a
computed ``$slice``, ``hint`` on updates, BSON stages, ...): rather than the driver working around
it, mongomock is patched to do what the server does (``mscheduler.testing.mongomock_patches``,
one documented rule per patch, each checked by a unit test). The patches apply to every
mongomock database of the process. ``mongos_database()`` (``mscheduler.testing.mongos``) adds a
sharded cluster's rules on top.

This module needs the test dependencies (``pip install 'mscheduler[testing]'``).
"""

from __future__ import annotations

from typing import Any


def mongomock_database(name: str = "mscheduler_test", **client_options: Any) -> Any:
    """A fresh in-memory async database for ``MongoDriver`` (no change streams, no sessions);
    ``client_options`` go to the client as to ``AsyncMongoClient`` (``tz_aware=True``, ...)."""
    from mongomock_motor import AsyncMongoMockClient

    from mscheduler.testing import mongomock_patches

    mongomock_patches.apply()
    return AsyncMongoMockClient(**client_options)[name]
