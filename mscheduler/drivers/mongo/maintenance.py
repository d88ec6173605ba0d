"""Maintenance of ``MongoDriver`` (a mixin): retention of finished tasks and the cap on the attempt
entries a task keeps.

Retention: one TTL index per terminal status on ``state.finish_time``, each partial on its
``state.status`` (MongoDB ≥ 5.0 allows several indexes on one key pattern when their partial
filters differ), so each status has its own period and a changed period is one ``collMod``. The
retention pass (``purge_finished``) reads the oldest finished keys of one status through that
same index and deletes them by key, re-checking status and finish time in the delete's filter
(a task restarted in between is not deleted): on a real server a backstop of the TTL monitor, on
mongomock (no TTL monitor) the mechanism.

Entry cap: a claim that makes a task hold more than ``ClaimParams.max_entries`` entries drops the
oldest entries that do not count (released, revoked, snoozed) inside the claim's pipeline
(``$slice`` with a computed length). mongomock cannot take a computed ``$slice`` length:
``setup()`` probes it, and where it is missing the claim is followed by a second write that drops
the same entries (computed here by ``trim_entries``; counted in ``fixups``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import ReturnDocument
from pymongo.errors import OperationFailure

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.partitions import by_part, part_of
from mscheduler.domain.state import TERMINAL
from mscheduler.drivers.base import (
    UNCOUNTED_STATUSES,
    ClaimParams,
    PurgeParams,
    RetentionParams,
    trim_entries,
)
from mscheduler.drivers.mongo.common import (
    FINISHED_INDEX,
    KEY_INDEX,
    WS,
    T,
    _derive_stages,
    _in,
    _out,
    _resolve,
    log,
    one_task,
)

RETENTION_INDEX_PREFIX = "retention_"
# createIndex refusals that mean "this server cannot hold these indexes" (an old server that
# allows one index per key pattern: IndexOptionsConflict, IndexKeySpecsConflict; CannotCreateIndex)
TTL_UNSUPPORTED_CODES = frozenset({85, 86, 67})
UNAUTHORIZED = 13  # a role without the right (collMod: readWrite has none)


def retention_index(status: str) -> str:
    """The name of the TTL index of finished tasks in ``status``."""
    return f"{RETENTION_INDEX_PREFIX}{status}"


class MongoMaintenance:
    """Retention and the entry cap of ``MongoDriver`` (uses ``_call``, ``tasks``, ``probe``)."""

    tasks: Any
    database: Any
    probe: Any
    fixups: int
    update_hints: bool
    slice_expressions: bool = True  # a computed $slice length in an update pipeline (probed)
    raw_stages: bool  # constant pipeline stages sent as BSON already (MongoDriver.__init__)
    _retention_indexes: frozenset[str] = frozenset()  # the TTL indexes known to exist

    if TYPE_CHECKING:

        @property
        def partitions(self) -> int: ...

        async def _call(
            self,
            what: str,
            operation: Callable[[], Awaitable[T]],
            *,
            recover: Callable[[], Awaitable[T | None]] | None = None,
            session: Any = None,
        ) -> T: ...

        def _hint(self, name: str) -> dict[str, Any]: ...

        async def _capabilities(self) -> None: ...

    # -- the entry cap --------------------------------------------------------------------------

    async def _probe_slice(self) -> bool:
        """Does an update pipeline take a computed ``$slice`` length? (mongomock does not.)"""
        try:
            await self.probe.update_one(
                {"_id": "slice"},
                [{"$set": {"s": {"$slice": [{"$literal": [1, 2, 3]}, {"$add": [1, 1]}]}}}],
                upsert=True,
            )
        except (OperationFailure, NotImplementedError):
            return False
        doc = await self.probe.find_one({"_id": "slice"})
        return bool(doc and doc.get("s") == [1, 2])

    def _trim_stages(self, params: ClaimParams) -> list[Any]:
        """After the claim's entry is appended: drop the oldest uncounted entries beyond
        ``max_entries`` (``drivers.base.trim_entries`` as a stage); none where the backend cannot
        compute the length (``_trim_after_claim`` does it then). Built once per ``max_entries``
        (as BSON already with ``raw_stages``, as ``_derive_stages``)."""
        if not self.slice_expressions:
            return []
        return [_trim_stage(params.max_entries, self.raw_stages)]

    async def _trim_after_claim(self, params: ClaimParams, doc: dict[str, Any]) -> dict[str, Any]:
        """Where the claim could not trim (no computed ``$slice``): drop the same entries with a
        second write; returns the document as it is after it."""
        entries = doc["state"]["worker_states"]
        kept = {e["attempt"] for e in trim_entries(entries, params.max_entries)}
        dropped = [e["attempt"] for e in entries if e["attempt"] not in kept]
        if not dropped:
            return doc
        cond = {"$eq": [{"$in": ["$$e.attempt", dropped]}, False]}  # tokens: no '$' (see claim)
        pipeline = [
            {"$set": {WS: {"$filter": {"input": f"${WS}", "as": "e", "cond": cond}}}},
            *_derive_stages(params.now),
        ]

        async def trim() -> dict[str, Any] | None:
            found: dict[str, Any] | None = await self.tasks.find_one_and_update(
                one_task(doc["key"], part_of(doc["key"], self.partitions)),
                pipeline,
                return_document=ReturnDocument.AFTER,
            )
            return found

        self.fixups += 1
        after = await self._call("trim entries", trim)
        return _in(after) if after is not None else doc

    # -- retention --------------------------------------------------------------------------------

    async def ensure_retention(self, params: RetentionParams) -> bool:
        """Create, change (``collMod``) or drop the TTL index of each terminal status to match
        ``params``; False if the server refused them (the retention pass then does the work)."""

        async def current() -> dict[str, dict[str, Any]]:
            cursor = await _resolve(self.tasks.list_indexes())
            return {ix["name"]: dict(ix) async for ix in cursor}

        existing = await self._call("list indexes", current)
        in_place: set[str] = set()
        ok = True
        if not await self._call("probe partial TTL indexes", self._probe_partial_ttl):
            # a backend whose TTL ignores the partial filter (mongomock) would remove tasks of
            # every status after the shortest period: no TTL indexes there, the pass does it
            for status in TERMINAL:
                if retention_index(status) in existing:
                    await self._drop_index(retention_index(status))
            self._retention_indexes = frozenset()
            return False
        for status in TERMINAL:
            name = retention_index(status)
            period = params.periods.get(status)
            if period is None:
                if name in existing:
                    await self._drop_index(name)
                continue
            seconds = int(period.total_seconds())
            index = existing.get(name)
            try:
                if index is None:
                    await self._create_ttl(name, status, seconds)
                elif index.get("expireAfterSeconds") != seconds:
                    await self._change_ttl(name, status, seconds)
            except StorageError as exc:
                cause = exc.__cause__
                if not (isinstance(cause, OperationFailure) and cause.code in TTL_UNSUPPORTED_CODES):
                    raise
                log.warning("no TTL index for %s tasks (%s): the retention pass removes them", status, exc)
                ok = False
                continue
            in_place.add(name)
        self._retention_indexes = frozenset(in_place)
        return ok

    async def _probe_partial_ttl(self) -> bool:
        """Does a partial TTL index leave documents outside its filter alone? A scratch document
        outside the filter of an index that expires at once: a real server keeps it (its TTL
        monitor honours the filter, and runs only once a minute); mongomock expires documents
        when they are read, ignoring the filter."""
        await self.probe.create_index(
            "ttl_t", name="ttl_probe", expireAfterSeconds=0, partialFilterExpression={"s": "inside"}
        )
        await self.probe.replace_one(
            {"_id": "ttl"}, {"_id": "ttl", "ttl_t": datetime(2000, 1, 1), "s": "outside"}, upsert=True
        )
        return await self.probe.find_one({"_id": "ttl"}) is not None

    async def _create_ttl(self, name: str, status: str, seconds: int) -> None:
        async def create() -> Any:
            return await self.tasks.create_index(
                "state.finish_time",
                name=name,
                expireAfterSeconds=seconds,
                # tasks of no family only: a family is removed whole by the retention pass
                partialFilterExpression={"state.status": status, "solo": True},
            )

        await self._call("create retention index", create)

    async def _drop_index(self, name: str) -> None:
        await self._call("drop retention index", lambda: self.tasks.drop_index(name))

    async def _change_ttl(self, name: str, status: str, seconds: int) -> None:
        command = {"collMod": self.tasks.name, "index": {"name": name, "expireAfterSeconds": seconds}}
        try:
            await self._call("change retention period", lambda: self.database.command(command))
        except StorageError as exc:
            # the readWrite role has no collMod (Unauthorized, SERVER-20772): build it again
            cause = exc.__cause__
            if not (isinstance(cause, OperationFailure) and cause.code == UNAUTHORIZED):
                raise
            log.warning("no collMod right: rebuilding the TTL index %s with the new period", name)
            await self._drop_index(name)
            await self._create_ttl(name, status, seconds)
        except (NotImplementedError, TypeError):  # a fake without collMod: build it again
            await self._drop_index(name)
            await self._create_ttl(name, status, seconds)

    async def purge_finished(self, params: PurgeParams) -> int:
        await self._capabilities()  # the deletes' hint
        # children are never removed alone (they go with their parent, below)
        filter_ = {
            "state.status": params.status,
            "state.finish_time": {"$lte": _out(params.before)},
            "parent": {"$exists": False},
        }

        async def oldest() -> list[dict[str, Any]]:
            cursor = (
                self.tasks.find(filter_, {"_id": 0, "key": 1, "children.keys": 1})
                .sort("state.finish_time", 1)
                .limit(params.limit)
                .hint(FINISHED_INDEX)  # (status, finish_time, key): the range, in order
            )
            return [doc async for doc in cursor]

        found = await self._call("find finished tasks", oldest)
        if not found:
            return 0
        keys = [doc["key"] for doc in found]
        children = [k for doc in found for k in (doc.get("children") or {}).get("keys", ())]
        # one delete per partition (a sharded cluster's one shard)
        for part, of_part in by_part(children, self.partitions).items():
            # a family's children first: a crash in between leaves a finished parent, which the
            # next pass removes (its children are all finished: it has a finish time)

            async def delete_children(of_part: list[str] = of_part, part: int = part) -> Any:
                return await self.tasks.delete_many(
                    {"key": {"$in": of_part}, "part": part}, **self._hint(KEY_INDEX)
                )

            await self._call("remove finished children", delete_children)
        deleted = 0
        for part, of_part in by_part(keys, self.partitions).items():

            async def delete(of_part: list[str] = of_part, part: int = part) -> Any:
                # the same conditions again: a task restarted since the read is left alone
                by_key = {"key": {"$in": of_part}, "part": part, **filter_}
                return await self.tasks.delete_many(by_key, **self._hint(KEY_INDEX))

            deleted += int((await self._call("remove finished tasks", delete)).deleted_count)
        return deleted


@functools.lru_cache(maxsize=64)
def _trim_stage(max_entries: int, raw: bool) -> Any:
    """The stage of ``_trim_stages`` for ``max_entries`` (shared: never changed once built)."""
    excess = {"$subtract": [{"$size": f"${WS}"}, max_entries]}
    uncounted = {
        "$filter": {
            "input": f"${WS}",
            "as": "e",
            "cond": {"$in": ["$$e.status", list(UNCOUNTED_STATUSES)]},
        }
    }
    dropped = {
        "$map": {"input": {"$slice": [uncounted, {"$max": [excess, 1]}]}, "as": "e", "in": "$$e.attempt"}
    }
    kept = {
        "$filter": {
            "input": f"${WS}",
            "as": "e",
            "cond": {"$eq": [{"$in": ["$$e.attempt", dropped]}, False]},
        }
    }
    stage = {"$set": {WS: {"$cond": [{"$gt": [excess, 0]}, kept, f"${WS}"]}}}
    return RawBSONDocument(bson.encode(stage)) if raw else stage
