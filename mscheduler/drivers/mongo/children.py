"""Child-task operations of ``MongoDriver`` (``mscheduler.services.children``): the sync of parents with
their children, the reconciler's read of unfinished parents, and statuses set by hand.

A sync reads the parents first, then their children (both from the primary, by key), so the
children it sees are at least as new as the summary it replaces; it writes the summary with a
compare-and-set on ``state.children_rev``: a sync that lost to another re-reads and tries again,
so a slower sync can never write an older summary over a newer one (no lost update)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from pymongo import UpdateOne

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.family import (
    MAP,
    SYNC_TRIES,
    MapExpansion,
    SyncPlan,
    child_keys_of,
    map_items,
    map_summary,
    plan_or_skip,
    result_of,
)
from mscheduler.domain.partitions import by_part, part_of
from mscheduler.drivers.base import (
    ExpandMapParams,
    MarkParams,
    OpenParentsParams,
    ResetStepsParams,
    StepResult,
    SyncOutcome,
    SyncParentsParams,
)
from mscheduler.drivers.mongo.common import (
    ADMIN_READ_MS,
    FAMILY_INDEX,
    KEY_INDEX,
    PARENTS_INDEX,
    T,
    admin_read,
    by_keys,
    derive_stages,
    from_mongo,
    literal,
    one_task,
    resolved,
    write_concern_only,
)

_OPEN = ["pending", "running"]
PARENT_FIELDS = {
    "_id": 0,
    "key": 1,
    "parent": 1,
    "children": 1,
    "state.children": 1,
    "state.children_rev": 1,
    "state.cancelled": 1,
}
CHILD_FIELDS = {"_id": 0, "key": 1, "state.status": 1, "state.blocked": 1, "children.mode": 1}
RESULT_FIELDS = {
    "_id": 0,
    "key": 1,
    "children": 1,
    "option.concurrent_worker_cnt": 1,
    "state.status": 1,
    "state.worker_states.status": 1,
    "state.worker_states.result": 1,
}


def _is_map(doc: dict[str, Any]) -> bool:
    definition = doc.get("children")
    return isinstance(definition, dict) and definition.get("mode") == MAP


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
            return [from_mongo(doc) async for doc in cursor]

        return await self._call(what, read)

    async def sync_parents(self, params: SyncParentsParams) -> SyncOutcome:
        keys = list(dict.fromkeys(params.keys))
        changed = 0
        expand: list[MapExpansion] = []
        cascade: list[str] = []
        for _ in range(SYNC_TRIES):
            if not keys:
                break
            parents = [
                doc
                for doc in await self._read_by_key("sync parents (read)", keys, PARENT_FIELDS)
                if doc.get("children")
            ]
            plans = await self._plan_syncs(parents, expand)
            unblock = [key for _, plan in plans for key in plan.unblock]
            if unblock:
                await self._unblock(unblock, params)
            ops, written = [], []
            for doc, plan in plans:
                if plan.summary == doc["state"].get("children"):
                    continue
                rev = doc["state"].get("children_rev")  # the compare-and-set
                change = {"state.children": literal(plan.summary), "state.children_rev": (rev or 0) + 1}
                written.append(doc["key"])
                if doc.get("parent") is not None:
                    cascade.append(doc["parent"])
                part = part_of(doc["key"], self.partitions)
                filter_ = {**one_task(doc["key"], part), "state.children_rev": rev}
                ops.append((part, UpdateOne(filter_, [{"$set": change}, *derive_stages(params.now)])))
            if not ops:
                break
            matched, uncertain = await self._write_summaries(ops)
            changed += matched
            if not uncertain and matched == len(ops):
                break
            # another sync wrote some of them meanwhile: read those again (the ones written now
            # compare equal and are skipped)
            keys = written
        unique = {e.key: e for e in expand}
        return SyncOutcome(changed, list(unique.values()), list(dict.fromkeys(cascade)))

    async def _plan_syncs(
        self, parents: list[dict[str, Any]], expand: list[MapExpansion]
    ) -> list[tuple[dict[str, Any], SyncPlan]]:
        """Each parent's sync (``plan_sync``; a map step's summary from the statuses among its
        items); the map steps to fan out are added to ``expand``."""
        maps = [doc for doc in parents if _is_map(doc)]
        families = [doc for doc in parents if not _is_map(doc)]
        child_keys = [key for doc in families for key in child_keys_of(doc)]
        children = {
            doc["key"]: doc
            for doc in await self._read_by_key("sync parents (read children)", child_keys, CHILD_FIELDS)
        }
        plans: list[tuple[dict[str, Any], SyncPlan]] = []
        for doc in families:
            plan = plan_or_skip(doc, children)
            if plan is not None:
                plans.append((doc, plan))
                expand += plan.expand
        for doc in maps:
            statuses = await self._item_statuses(doc["key"])
            plans.append(
                (doc, SyncPlan(map_summary(statuses, doc["children"].get("on_failure", "fail")), []))
            )
        return plans

    async def _item_statuses(self, key: str) -> list[str]:
        """The statuses among a map step's items: a DISTINCT_SCAN of ``family`` (one key per
        status, however many items). Not hinted: ``distinct`` takes a hint from MongoDB 7.1 on;
        ``family`` is the only index on ``parent`` (tests/real checks the plan)."""

        async def read() -> list[str]:
            found = await self.tasks_primary.distinct("state.status", {"parent": key})
            return [s for s in found if isinstance(s, str)]

        return await self._call("map step statuses", read)

    async def _write_summaries(self, ops: list[tuple[int, UpdateOne]]) -> tuple[int, bool]:
        """The summaries' compare-and-sets, one bulk write per partition (one shard): how many
        matched, and whether some were applied without a majority's confirmation."""
        matched = 0
        uncertain = False
        for part in sorted({p for p, _ in ops}):
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
        return matched, uncertain

    async def _unblock(self, keys: list[str], params: SyncParentsParams) -> None:
        pipeline = [{"$set": {"state.blocked": False}}, *derive_stages(params.now)]
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

    # -- workflows ----------------------------------------------------------------------------

    async def read_results(self, keys: Sequence[str]) -> dict[str, StepResult]:
        steps = await self._read_by_key("read step results", list(dict.fromkeys(keys)), RESULT_FIELDS)
        out: dict[str, StepResult] = {}
        for doc in steps:
            if _is_map(doc):
                out[doc["key"]] = StepResult(doc["state"]["status"], await self._item_results(doc["key"]))
            else:
                out[doc["key"]] = StepResult(doc["state"]["status"], result_of(doc))
        return out

    async def _item_results(self, key: str) -> list[Any]:
        """The results of a map step's succeeded items, in the items' order (``family``)."""
        filter_ = {"parent": key, "state.status": "succeeded"}

        async def read() -> list[Any]:
            cursor = self.tasks_primary.find(filter_, RESULT_FIELDS).sort("position", 1).hint(FAMILY_INDEX)
            return [result_of(from_mongo(doc)) async for doc in cursor]

        return await self._call("read map step results", read)

    async def count_items(self, key: str) -> dict[str, int]:
        # covered by ``family`` (parent, state.status): index keys only, no document read
        pipeline = [
            {"$match": {"parent": key}},
            {"$group": {"_id": "$state.status", "n": {"$sum": 1}}},
        ]

        async def read() -> dict[str, int]:
            cursor = await resolved(
                self.tasks.aggregate(pipeline, hint=FAMILY_INDEX, maxTimeMS=ADMIN_READ_MS)
            )
            return {row["_id"]: int(row["n"]) async for row in cursor if isinstance(row["_id"], str)}

        return await self._call("count map items", lambda: admin_read("count map items", read))

    async def expand_map(self, params: ExpandMapParams) -> bool:
        filter_ = {
            "key": params.key,
            "part": part_of(params.key, self.partitions),
            "children": {"$exists": False},
            "state.blocked": True,
        }
        # the items' statuses so far (some may have run already): the summary, as a sync writes it
        on_failure = params.on_failure
        summary = map_summary(await self._item_statuses(params.key), on_failure)
        change = {
            "children": literal({"mode": MAP, "count": params.count, "on_failure": on_failure}),
            "state.blocked": False,
            "state.children": literal(summary),
            "state.children_rev": 0,
        }
        pipeline = [{"$set": change}, *derive_stages(params.now)]

        async def update() -> Any:
            return await self.tasks.update_one(filter_, pipeline)

        return bool((await self._call("fan out", update)).matched_count)

    async def reset_steps(self, params: ResetStepsParams) -> int:
        keys = list(dict.fromkeys(params.keys))
        steps = await self._read_by_key("reset steps (read)", keys, {"_id": 0, "key": 1, "children": 1})
        items = [key for doc in steps for key in map_items(doc)]
        for part, of_part in by_part(items, self.partitions).items():
            filter_ = {"key": {"$in": of_part}, "part": part, "state.running_cnt": 0}

            async def delete(filter_: dict[str, Any] = filter_) -> Any:
                return await self.tasks.delete_many(filter_)

            await self._call("reset steps (remove items)", delete)
        pipeline = [
            {"$project": {"children": 0, "state.children": 0, "state.children_rev": 0}},
            {"$set": {"state.blocked": True}},
            *derive_stages(params.now),
        ]
        reset = 0
        for part, of_part in by_part(keys, self.partitions).items():
            filter_ = {"key": {"$in": of_part}, "part": part, "state.running_cnt": 0}

            async def update(filter_: dict[str, Any] = filter_) -> Any:
                return await self.tasks.update_many(filter_, pipeline)

            reset += (await self._call("reset steps", update)).matched_count
        return reset

    async def mark_task(self, params: MarkParams) -> bool:
        filter_ = {
            **one_task(params.key, part_of(params.key, self.partitions)),
            "state.status": {"$in": list(params.statuses)},
            "state.running_cnt": 0,
            "children": {"$exists": False},
        }
        marked = {"status": params.status, "reason": params.reason, "by": params.by, "time": params.now}
        pipeline = [{"$set": {"state.marked": literal(marked)}}, *derive_stages(params.now)]

        async def update() -> Any:
            return await self.tasks.update_one(filter_, pipeline)

        result = await self._call("mark task", update)
        return bool(result.matched_count)
