"""Operator reads and changes of ``MongoDriver`` on the tasks collection: get, list, count,
live option changes and the operators' compare-and-set controls (cancel, pause, resume, remove,
restart). The claim path lives in ``mongo.py``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mscheduler.drivers.base import ControlParams, ListParams, UpdateOptionParams
from mscheduler.drivers.mongo_common import (
    ALL_STATUSES,
    CREATED_INDEX,
    NAME_INDEX,
    STATUS_INDEX,
    WS,
    T,
    _derive_stages,
    _in,
    _lit,
    _resolve,
    read_page,
)
from mscheduler.exceptions import InvalidInput


class MongoTaskQueries:
    """Task reads and operator changes of ``MongoDriver`` (a mixin: it uses ``_call``, ``tasks``)."""

    tasks: Any

    if TYPE_CHECKING:

        async def _call(
            self,
            what: str,
            operation: Callable[[], Awaitable[T]],
            *,
            recover: Callable[[], Awaitable[T | None]] | None = None,
            session: Any = None,
        ) -> T: ...

    async def get_task(self, key: str) -> dict[str, Any] | None:
        doc = await self._call("get task", lambda: self.tasks.find_one({"key": key}, {"_id": 0}))
        return _in(doc) if doc is not None else None

    async def list_tasks(self, params: ListParams) -> list[dict[str, Any]]:
        # Each filter has an index that also gives the order (create_time, key): by status, by
        # name (with every status listed, so the per-status ranges merge in order), or all.
        filter_: dict[str, Any] = {}
        index = CREATED_INDEX
        if params.status is not None:
            filter_["state.status"] = params.status
            index = STATUS_INDEX
        if params.name is not None:
            filter_["name"] = params.name
            filter_.setdefault("state.status", {"$in": ALL_STATUSES})
            index = NAME_INDEX

        order = [("state.create_time", 1), ("key", 1)]
        return await self._call(
            "list tasks", lambda: read_page(self.tasks, filter_, order, params.skip, params.limit, index)
        )

    async def count_by_status(self) -> dict[str, int]:
        # Covered by the status index: keys only, no document is fetched.
        pipeline = [
            {"$match": {"state.status": {"$in": ALL_STATUSES}}},
            {"$group": {"_id": "$state.status", "n": {"$sum": 1}}},
        ]

        async def read() -> dict[str, int]:
            cursor = await _resolve(self.tasks.aggregate(pipeline, hint=STATUS_INDEX))
            return {doc["_id"]: doc["n"] async for doc in cursor}

        return await self._call("count by status", read)

    async def update_option(self, params: UpdateOptionParams) -> bool:
        pipeline = [{"$set": {"option": _lit(params.option)}}, *_derive_stages(params.now)]

        async def update() -> Any:
            return await self.tasks.update_one({"key": params.key}, pipeline)

        result = await self._call("update option", update)
        return bool(result.matched_count)

    async def control_task(self, params: ControlParams) -> bool:
        # The filter is the compare-and-set: the key in one of the allowed statuses.
        filter_ = {"key": params.key, "state.status": {"$in": list(params.statuses)}}
        if params.action == "remove":
            deleted = await self._call("remove task", lambda: self.tasks.delete_one(filter_))
            return bool(deleted.deleted_count)
        now = _lit(params.now)
        change: dict[str, Any]
        if params.action == "cancel":
            change = {"state.cancelled": _lit({"reason": params.reason, "time": params.now})}
        elif params.action in ("pause", "resume"):
            change = {"state.paused": _lit(params.action == "pause")}
        elif params.action == "restart":
            generation = {"$ifNull": ["$state.generation", 0]}
            record = {"generation": generation, "restart_time": now, "worker_states": f"${WS}"}
            change = {
                # [record] as a $map over one element: an array literal's field paths are not
                # evaluated by mongomock
                "state.history": {
                    "$concatArrays": [
                        {"$ifNull": ["$state.history", []]},
                        {"$map": {"input": _lit([0]), "as": "x", "in": record}},
                    ]
                },
                "state.generation": {"$add": [generation, 1]},
                WS: _lit([]),
                "state.cancelled": None,
                "state.expired_at": None,
                "state.broken": None,
                # a deadline already past would expire the new generation at once
                "option.deadline": {"$cond": [{"$lte": ["$option.deadline", now]}, None, "$option.deadline"]},
            }
        else:
            raise InvalidInput(f"unknown control action {params.action!r}")
        pipeline = [{"$set": change}, *_derive_stages(params.now)]

        async def update() -> Any:
            return await self.tasks.update_one(filter_, pipeline)

        result = await self._call(f"{params.action} task", update)
        return bool(result.matched_count)
