"""Fakes of a replica set's collection and database for the Mongo driver's real-server-only paths
(the audit of 2026-11-25, issue 17 C): what a node sees at each read concern and read preference,
write-concern-only bulk errors, refusals by code. They wrap mongomock-motor collections, so the
driver's queries run as they do elsewhere in the suite; what they add is the part mongomock has
no notion of (replication, roles, server codes). Each test that uses one has a twin in
``tests/real`` that shows the same on a server.
"""

from __future__ import annotations

import copy
import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from mscheduler.testing.mongomock import mongomock_database


class ReplicaSet:
    """One collection of a replica set whose majority-committed view lags the primary: a write is
    on the primary at once, and in the majority snapshot only after ``replicate()`` (a PSA set with
    its secondary down never gets there: ``w: majority`` writes time out with code 64)."""

    def __init__(self, name: str = "mscheduler_tasks") -> None:
        self.database = mongomock_database(f"rs_{id(self)}")
        self.primary = self.database[name]
        self.snapshot = self.database[f"{name}_majority_snapshot"]
        self.reads: Counter[str] = Counter()  # reads by "<read preference>/<read concern>"

    async def replicate(self) -> None:
        await self.snapshot.delete_many({})
        docs = [copy.deepcopy(doc) async for doc in self.primary.find({})]
        if docs:
            await self.snapshot.insert_many(docs)

    def collection(self) -> ReplicatedCollection:
        return ReplicatedCollection(self)


class ReplicatedCollection:
    """A view of the replica set's collection with its own read preference and read concern
    (``with_options`` returns another view, as PyMongo's does). Writes go to the primary. Reads
    on the primary at local read concern see its data; reads at ``majority``, and reads a
    secondary may serve (the client's ``secondaryPreferred``), see the lagging snapshot. Hooks:
    ``after[method]`` runs after a write was applied (to raise what the server answered)."""

    def __init__(
        self,
        rs: ReplicaSet,
        read_preference: Any = ReadPreference.SECONDARY_PREFERRED,
        level: str | None = None,
    ) -> None:
        self._rs = rs
        self.read_preference = read_preference
        self.level = level
        self.after: dict[str, Callable[[], None]] = rs.__dict__.setdefault("_after", {})
        self.name = rs.primary.name
        self.database = rs.database

    def with_options(self, *, read_preference: Any = None, read_concern: Any = None, **_: Any) -> Any:
        level = getattr(read_concern, "level", None) if read_concern is not None else self.level
        return ReplicatedCollection(self._rs, read_preference or self.read_preference, level)

    def _source(self) -> Any:
        where = f"{self.read_preference.name.lower()}/{self.level or 'local'}"
        self._rs.reads[where] += 1
        stale = self.level == "majority" or self.read_preference != ReadPreference.PRIMARY
        return self._rs.snapshot if stale else self._rs.primary

    async def find_one(self, *args: Any, **kwargs: Any) -> Any:
        return await self._source().find_one(*args, **kwargs)

    def find(self, *args: Any, **kwargs: Any) -> Any:
        return self._source().find(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rs.primary, name)
        hook = self.after.get(name)
        if hook is None or not callable(attr):
            return attr

        async def write_then_hook(*args: Any, **kwargs: Any) -> Any:
            result = await attr(*args, **kwargs)
            self.after.pop(name, None)
            hook()
            return result

        return write_then_hook


class Database:
    """A mongomock-motor database whose ``collections`` are replaced by the given fakes."""

    def __init__(self, inner: Any, collections: dict[str, Any]) -> None:
        self._inner = inner
        self._collections = collections
        self.name = inner.name

    def __getitem__(self, name: str) -> Any:
        return self._collections.get(name) or self._inner[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ServerIndexes:
    """A mongomock-motor collection whose ``create_index`` refuses a conflicting index as a server
    does, by code: 86 (IndexKeySpecsConflict: the name exists with other keys) or 85
    (IndexOptionsConflict: the name or the keys exist with other options). mongomock raises a
    code-less OperationFailure for both."""

    def __init__(self, inner: Any, database: Any = None) -> None:
        self._inner = inner
        self.database = database if database is not None else inner.database
        self.created: list[str] = []
        self.dropped: list[str] = []

    async def create_index(self, keys: Any, **options: Any) -> Any:
        try:
            name = await self._inner.create_index(keys, **options)
        except OperationFailure as exc:
            if exc.code is not None or "already exists" not in str(exc):
                raise
            wanted = list(keys.items()) if isinstance(keys, dict) else keys
            wanted = [(keys, 1)] if isinstance(wanted, str) else [tuple(k) for k in wanted]
            existing = {ix["name"]: ix async for ix in await _resolve(self._inner.list_indexes())}
            same = existing.get(options.get("name"))
            code = 86 if same is not None and list(same["key"].items()) != wanted else 85
            raise OperationFailure(f"{exc} (as a server answers: code {code})", code=code) from None
        self.created.append(options.get("name", name))
        return name

    async def drop_index(self, name: str) -> Any:
        self.dropped.append(name)
        return await self._inner.drop_index(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class Refusing(Database):
    """A database whose ``command`` refuses the commands named in ``refuse`` with the given code
    (``{"collMod": 13}``: the ``readWrite`` role has no collMod, SERVER-20772); the others are not
    implemented (mongomock has no ``command``)."""

    def __init__(self, inner: Any, collections: dict[str, Any], refuse: dict[str, int]) -> None:
        super().__init__(inner, collections)
        self.refuse = refuse
        self.commands: list[str] = []

    async def command(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        name = next(iter(command))
        self.commands.append(name)
        if name in self.refuse:
            code = self.refuse[name]
            raise OperationFailure(f"not authorized on {self.name} to execute command {{{name}}}", code=code)
        raise NotImplementedError(f"{name} is not implemented by this fake")
