"""The Mongo driver's plans: the ``<prefix>mscheduler_plans`` collection, its indexes and queries.

Like ``mongo.py`` / ``mongo_common.py``, one of the only modules that know the storage layout.
A plan's ``_id`` is its ``plan_id`` (so a second insert of an id is a duplicate key error, and
every per-plan write is served by ``_id``). Every write is a compare-and-set on ``version``.

Indexes (every read names its index with ``hint``):

============== ============================================ =========================================
``plans_due``   ``state, due_time``                          ``find_due_plans``: equality on the two
                                                             planner states, ``due_time <= now``;
                                                             the two ranges merge in due order
``plans_list``  ``state, create_time, plan_id``              ``list_plans(state=...)``
``plans_created`` ``create_time, plan_id``                   ``list_plans()``
============== ============================================ =========================================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pymongo import UpdateOne, WriteConcern
from pymongo.errors import BulkWriteError, DuplicateKeyError

from mscheduler.domain.plans import PLANNER_STATES
from mscheduler.drivers.base import (
    AdvancePlansParams,
    DuePlansParams,
    InsertPlanParams,
    PlanListParams,
    RunOutcome,
    UpdatePlanParams,
)
from mscheduler.drivers.mongo.common import (
    CONFIG_CODES,
    KEY_INDEX,
    by_keys,
    from_mongo,
    read_page,
    to_mongo,
    write_concern_codes,
)
from mscheduler.drivers.mongo.indexes import ensure_indexes

T = TypeVar("T")

PLANS = "mscheduler_plans"
PLANS_DUE_INDEX = "plans_due"
PLANS_LIST_INDEX = "plans_list"
PLANS_CREATED_INDEX = "plans_created"
PLAN_INDEXES: list[tuple[Any, dict[str, Any]]] = [
    ([("state", 1), ("due_time", 1)], {"name": PLANS_DUE_INDEX}),
    ([("state", 1), ("create_time", 1), ("plan_id", 1)], {"name": PLANS_LIST_INDEX}),
    ([("create_time", 1), ("plan_id", 1)], {"name": PLANS_CREATED_INDEX}),
]
PLAN_INDEX_NAMES = tuple(options["name"] for _, options in PLAN_INDEXES)


def plans_collection(database: Any, prefix: str, concern: WriteConcern | None) -> Any:
    """The plans collection, with the tasks' write concern."""
    plans = database[f"{prefix}{PLANS}"]
    return plans.with_options(write_concern=concern) if concern is not None else plans


class MongoPlans:
    """Plan operations of ``MongoDriver`` (a mixin: it uses the driver's ``_call`` and ``tasks``)."""

    plans: Any
    plans_primary: Any
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

    async def _create_plan_indexes(self) -> None:
        await ensure_indexes(self.plans, PLAN_INDEXES)

    async def insert_plan(self, params: InsertPlanParams) -> bool:
        doc = to_mongo({"_id": params.plan["plan_id"], **params.plan})

        async def insert() -> bool:
            try:
                await self.plans.insert_one(doc)
            except DuplicateKeyError:
                return False
            return True

        async def recover() -> bool | None:
            # the reply was lost: ours if the stored plan is the one we sent (same create_time)
            found = await self.plans_primary.find_one({"_id": doc["_id"]}, {"create_time": 1, "version": 1})
            # compared as aware UTC: a tz_aware client reads aware datetimes, the sent one is naive
            same_time = found is not None and from_mongo(found.get("create_time")) == from_mongo(
                doc["create_time"]
            )
            if found is not None and same_time and found["version"] == 1:
                return True
            return None

        return await self._call("insert plan", insert, recover=recover)

    async def get_plan(self, plan_id: str) -> dict[str, Any] | None:
        doc = await self._call("get plan", lambda: self.plans.find_one({"_id": plan_id}, {"_id": 0}))
        return from_mongo(doc) if doc is not None else None

    async def list_plans(self, params: PlanListParams) -> list[dict[str, Any]]:
        filter_: dict[str, Any] = {}
        index = PLANS_CREATED_INDEX
        if params.state is not None:
            filter_["state"] = params.state
            index = PLANS_LIST_INDEX

        order = [("create_time", 1), ("plan_id", 1)]
        return await self._call(
            "list plans", lambda: read_page(self.plans, filter_, order, params.skip, params.limit, index)
        )

    async def update_plan(self, params: UpdatePlanParams) -> bool:
        update = {"$set": to_mongo({**params.fields, "update_time": params.now})}

        async def write() -> Any:
            return await self.plans.update_one({"_id": params.plan_id, "version": params.version}, update)

        async def recover() -> Any:
            # the reply was lost: applied if the plan now holds the version we wrote
            found = await self.plans_primary.find_one({"_id": params.plan_id}, {"version": 1})
            return _Matched(1) if found is not None and found["version"] == params.fields["version"] else None

        result = await self._call("update plan", write, recover=recover)
        return bool(result.matched_count)

    async def delete_plan(self, plan_id: str) -> bool:
        result = await self._call("delete plan", lambda: self.plans.delete_one({"_id": plan_id}))
        return bool(result.deleted_count)

    async def find_due_plans(self, params: DuePlansParams) -> list[dict[str, Any]]:
        # plans_due: equality on the two planner states, then due_time <= now; the two ranges
        # merge in due_time order (no in-memory sort). Suspended, error and ended plans are
        # outside every range read.
        filter_ = {"state": {"$in": list(PLANNER_STATES)}, "due_time": {"$lte": to_mongo(params.now)}}

        async def read() -> list[dict[str, Any]]:
            cursor = (
                self.plans_primary.find(filter_, {"_id": 0})
                .sort("due_time", 1)
                .limit(params.limit)
                .hint(PLANS_DUE_INDEX)
            )
            return [from_mongo(doc) async for doc in cursor]

        return await self._call("find due plans", read)

    async def advance_plans(self, params: AdvancePlansParams) -> int:
        """One unordered bulk write of compare-and-sets, each on ``_id`` + version + next fire time."""
        if not params.advances:
            return 0
        now = to_mongo(params.now)
        ops = [
            UpdateOne(
                {"_id": a.plan_id, "version": a.version, "next_fire_time": to_mongo(a.next_fire_time)},
                {"$set": to_mongo({**a.fields, "update_time": now})},
            )
            for a in params.advances
        ]

        async def write() -> int:
            try:
                result = await self.plans.bulk_write(ops, ordered=False)
            except BulkWriteError as exc:
                if exc.details.get("writeErrors") or write_concern_codes(exc) & CONFIG_CODES:
                    raise
                # applied on the primary, not yet confirmed by a majority: not a failure
                return int(exc.details.get("nMatched", 0))
            return int(result.matched_count)

        # A retried bulk after a lost reply matches only what had not been applied (the version
        # moved on): safe to repeat; the count is then of the last try.
        return await self._call("advance plans", write)

    async def get_run_outcomes(self, keys: Sequence[str]) -> dict[str, RunOutcome]:
        if not keys:
            return {}
        projection = {"_id": 0, "key": 1, "plan_id": 1, "state.status": 1, "state.worker_states.end_time": 1}

        async def read() -> list[dict[str, Any]]:
            filter_ = by_keys(list(keys), self.partitions)
            cursor = self.tasks_primary.find(filter_, projection).hint(KEY_INDEX)
            return [from_mongo(doc) async for doc in cursor]

        outcomes: dict[str, RunOutcome] = {}
        for doc in await self._call("read run outcomes", read):
            state = doc.get("state", {})
            ends = [
                e["end_time"]
                for e in state.get("worker_states", [])
                if isinstance(e.get("end_time"), datetime)
            ]
            outcomes[doc["key"]] = RunOutcome(
                doc["key"], state.get("status", "pending"), max(ends) if ends else None, doc.get("plan_id")
            )
        return outcomes


class _Matched:
    """An update result found by a recovery read."""

    def __init__(self, matched_count: int) -> None:
        self.matched_count = matched_count
