"""Child-task operations of ``MongoDriver`` (``mscheduler.services.children``): the sync of parents with
their children, the reconciler's read of unfinished parents, and statuses set by hand.

A sync reads the parents first, then their children (both from the primary, by key), so the
children it sees are at least as new as the summary it replaces; it writes the summary with a
compare-and-set on ``state.children_rev``: a sync that lost to another re-reads and tries again,
so a slower sync can never write an older summary over a newer one (no lost update)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pymongo import UpdateOne

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.family import SYNC_TRIES, child_keys_of, plan_or_skip
from mscheduler.domain.partitions import by_part, part_of
from mscheduler.drivers.base import MarkParams, OpenParentsParams, SyncParentsParams
from mscheduler.drivers.mongo.common import (
    KEY_INDEX,
    PARENTS_INDEX,
    T,
    _derive_stages,
    _in,
    _lit,
    by_keys,
    one_task,
    write_concern_only,
)

_OPEN = ["pending", "running"]
PARENT_FIELDS = {
    "_id": 0,
    "key": 1,
    "children": 1,
    "state.children": 1,
    "state.children_rev": 1,
    "state.cancelled": 1,
}


class MongoChildren:
    """Child-task operations of ``MongoDriver`` (a mixin: it uses ``_call`` and the collections)."""

    tasks: Any
    tasks_primary: Any

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

    async def _read_by_key(
        self, what: str, keys: list[str], projection: dict[str, Any]
    ) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            cursor = self.tasks_primary.find(by_keys(keys, self.partitions), projection).hint(KEY_INDEX)
            return [_in(doc) async for doc in cursor]

        return await self._call(what, read)

    async def sync_parents(self, params: SyncParentsParams) -> int:
        keys = list(dict.fromkeys(params.keys))
        changed = 0
        for _ in range(SYNC_TRIES):
            if not keys:
                break
            parents = [
                doc
                for doc in await self._read_by_key(
                    "sync parents (read)",
                    keys,
                    PARENT_FIELDS,
                )
                if doc.get("children")
            ]
            child_keys = [key for doc in parents for key in child_keys_of(doc)]
            children = {
                doc["key"]: doc
                for doc in await self._read_by_key(
                    "sync parents (read children)",
                    child_keys,
                    {"_id": 0, "key": 1, "state.status": 1, "state.blocked": 1},
                )
            }
            plans = [(doc, plan) for doc in parents if (plan := plan_or_skip(doc, children)) is not None]
            unblock = [key for _, plan in plans for key in plan.unblock]
            if unblock:
                await self._unblock(unblock, params)
            ops, written = [], []
            for doc, plan in plans:
                if plan.summary == doc["state"].get("children"):
                    continue
                rev = doc["state"].get("children_rev")  # the compare-and-set
                change = {"state.children": _lit(plan.summary), "state.children_rev": (rev or 0) + 1}
                written.append(doc["key"])
                ops.append(
                    (
                        part_of(doc["key"], self.partitions),
                        UpdateOne(
                            {
                                **one_task(doc["key"], part_of(doc["key"], self.partitions)),
                                "state.children_rev": rev,
                            },
                            [{"$set": change}, *_derive_stages(params.now)],
                        ),
                    )
                )
            if not ops:
                break
            matched = 0
            uncertain = False
            for part in sorted({p for p, _ in ops}):  # one bulk write per partition (one shard)
                batch = [op for p, op in ops if p == part]

                async def write(batch: list[UpdateOne] = batch) -> Any:
                    return await self.tasks.bulk_write(batch, ordered=False)

                try:
                    matched += (await self._call("sync parents", write)).matched_count
                except StorageError as exc:
                    if exc.config or not write_concern_only(exc.__cause__):
                        raise
                    # applied on the primary, not yet confirmed by a majority (65 with write-concern
                    # errors only): read again; what landed compares equal and is skipped
                    uncertain = True
            changed += matched
            if not uncertain and matched == len(ops):
                break
            # another sync wrote some of them meanwhile: read those again (the ones written now
            # compare equal and are skipped)
            keys = written
        return changed

    async def _unblock(self, keys: list[str], params: SyncParentsParams) -> None:
        pipeline = [{"$set": {"state.blocked": False}}, *_derive_stages(params.now)]
        for part, of_part in by_part(keys, self.partitions).items():
            filter_ = {"key": {"$in": of_part}, "part": part, "state.blocked": True}

            async def update(filter_: dict[str, Any] = filter_) -> Any:
                return await self.tasks.update_many(filter_, pipeline)

            await self._call("unblock children", update)

    async def find_open_parents(self, params: OpenParentsParams) -> list[str]:
        # the partial index holds parents only; the filter repeats its condition, so that the
        # server may use it
        filter_: dict[str, Any] = {"children": {"$exists": True}, "state.status": {"$in": _OPEN}}
        if params.after is not None:
            filter_["key"] = {"$gt": params.after}

        async def read() -> list[str]:
            cursor = (
                self.tasks_primary.find(filter_, {"_id": 0, "key": 1})
                .sort("key", 1)
                .limit(params.limit)
                .hint(PARENTS_INDEX)
            )
            return [doc["key"] async for doc in cursor]

        return await self._call("find open parents", read)

    async def mark_task(self, params: MarkParams) -> bool:
        filter_ = {
            **one_task(params.key, part_of(params.key, self.partitions)),
            "state.status": {"$in": list(params.statuses)},
            "state.running_cnt": 0,
            "children": {"$exists": False},
        }
        marked = {"status": params.status, "reason": params.reason, "by": params.by, "time": params.now}
        pipeline = [{"$set": {"state.marked": _lit(marked)}}, *_derive_stages(params.now)]

        async def update() -> Any:
            return await self.tasks.update_one(filter_, pipeline)

        result = await self._call("mark task", update)
        return bool(result.matched_count)
