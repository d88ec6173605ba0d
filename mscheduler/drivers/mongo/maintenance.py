"""Maintenance of ``MongoDriver`` (a mixin): retention of finished tasks and the cap on the attempt
entries a task keeps.

Retention: one TTL index per terminal status on ``state.finish_time``, each partial on its
``state.status`` (MongoDB ≥ 5.0 allows several indexes on one key pattern when their partial
filters differ), so each status has its own period and a changed period is one ``collMod``. The
retention pass (``purge_finished``) reads the oldest finished keys of one status through that
same index and deletes them by key, re-checking status and finish time in the delete's filter
(a task restarted in between is not deleted): a backstop of the TTL monitor, and the mechanism
for families (a TTL index holds tasks of no family only).

Entry cap: a claim that makes a task hold more than ``ClaimParams.max_entries`` entries drops the
oldest entries that do not count (released, revoked, snoozed) inside the claim's pipeline
(``$slice`` with a computed length; ``drivers.base.trim_entries`` is the rule).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import bson
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.family import map_items
from mscheduler.domain.partitions import by_part
from mscheduler.domain.state import TERMINAL
from mscheduler.drivers.base import (
    UNCOUNTED_STATUSES,
    ClaimParams,
    PurgeParams,
    RetentionParams,
)
from mscheduler.drivers.mongo.common import (
    FINISHED_INDEX,
    KEY_INDEX,
    WORKER_STATES,
    T,
    log,
    resolved,
    to_mongo,
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
    """Retention and the entry cap of ``MongoDriver`` (uses ``_call``, ``tasks``)."""

    tasks: Any
    database: Any
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

    # -- the entry cap --------------------------------------------------------------------------

    def _trim_stages(self, params: ClaimParams) -> list[Any]:
        """After the claim's entry is appended: drop the oldest uncounted entries beyond
        ``max_entries`` (``drivers.base.trim_entries`` as a stage). Built once per
        ``max_entries``, as BSON already (as ``derive_stages``)."""
        return [_trim_stage(params.max_entries)]

    # -- retention --------------------------------------------------------------------------------

    async def ensure_retention(self, params: RetentionParams) -> bool:
        """Create, change (``collMod``) or drop the TTL index of each terminal status to match
        ``params``; False if the server refused them (the retention pass then does the work)."""

        async def current() -> dict[str, dict[str, Any]]:
            cursor = await resolved(self.tasks.list_indexes())
            return {ix["name"]: dict(ix) async for ix in cursor}

        existing = await self._call("list indexes", current)
        in_place: set[str] = set()
        ok = True
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

    async def _items_of(self, children: list[str]) -> list[str]:
        """The item keys of the fanned-out map steps among ``children`` (derived from their
        count: ``item_key``)."""
        if not children:
            return []

        async def read() -> list[dict[str, Any]]:
            filter_ = {"key": {"$in": children}, "children": {"$exists": True}}
            cursor = self.tasks.find(filter_, {"_id": 0, "key": 1, "children": 1}).hint(KEY_INDEX)
            return [doc async for doc in cursor]

        steps = await self._call("find map steps", read)
        return [key for doc in steps for key in map_items(doc)]

    async def purge_finished(self, params: PurgeParams) -> int:
        # children are never removed alone (they go with their parent, below)
        filter_ = {
            "state.status": params.status,
            "state.finish_time": {"$lte": to_mongo(params.before)},
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
        # a workflow's map steps' items before the steps (a crash in between: the next pass
        # finds the same family and derives the same item keys)
        children = await self._items_of(children) + children
        # one delete per partition (a sharded cluster's one shard) and per ``limit`` children: a
        # batch of families with many children each is never one unbounded command
        for part, of_part in by_part(children, self.partitions).items():
            # a family's children first: a crash in between leaves a finished parent, which the
            # next pass removes (its children are all finished: it has a finish time)
            for start in range(0, len(of_part), params.limit):
                chunk = of_part[start : start + params.limit]

                async def delete_children(chunk: list[str] = chunk, part: int = part) -> Any:
                    return await self.tasks.delete_many({"key": {"$in": chunk}, "part": part}, hint=KEY_INDEX)

                await self._call("remove finished children", delete_children)
        deleted = 0
        for part, of_part in by_part(keys, self.partitions).items():

            async def delete(of_part: list[str] = of_part, part: int = part) -> Any:
                # the same conditions again: a task restarted since the read is left alone
                by_key = {"key": {"$in": of_part}, "part": part, **filter_}
                return await self.tasks.delete_many(by_key, hint=KEY_INDEX)

            deleted += int((await self._call("remove finished tasks", delete)).deleted_count)
        return deleted


@functools.lru_cache(maxsize=64)
def _trim_stage(max_entries: int) -> Any:
    """The stage of ``_trim_stages`` for ``max_entries`` (shared: never changed once built)."""
    excess = {"$subtract": [{"$size": f"${WORKER_STATES}"}, max_entries]}
    uncounted = {
        "$filter": {
            "input": f"${WORKER_STATES}",
            "as": "e",
            "cond": {"$in": ["$$e.status", list(UNCOUNTED_STATUSES)]},
        }
    }
    dropped = {
        "$map": {"input": {"$slice": [uncounted, {"$max": [excess, 1]}]}, "as": "e", "in": "$$e.attempt"}
    }
    kept = {
        "$filter": {
            "input": f"${WORKER_STATES}",
            "as": "e",
            "cond": {"$eq": [{"$in": ["$$e.attempt", dropped]}, False]},
        }
    }
    stage = {"$set": {WORKER_STATES: {"$cond": [{"$gt": [excess, 0]}, kept, f"${WORKER_STATES}"]}}}
    return RawBSONDocument(bson.encode(stage))
