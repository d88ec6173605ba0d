"""Worker registry operations of ``MongoDriver`` (the workers collection): registration,
heartbeats with remote stop requests, listing.

A registration is written at a consumer's (or an executor's) start and by its heartbeats; a new
worker id per start and per executor means registrations pile up, so they expire: a TTL index on
``last_seen`` (``workers_ttl``, the driver's ``worker_retention``: 1 day) removes a stopped or
silent worker that long after it was last seen, and no listing shows one meanwhile (the TTL
monitor runs once a minute). Listings are index-served: the live workers (the metrics' and the
publisher's read) on ``workers_live`` (stop_time, last_seen), the registry's pages in start order
on ``workers_list`` (start_time, _id)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import ReturnDocument

from mscheduler.drivers.base import WorkerInfo, WorkerListParams
from mscheduler.drivers.mongo.common import ADMIN_READ_MS, T, admin_read, from_mongo, literal, to_mongo
from mscheduler.drivers.mongo.indexes import IndexDef, ensure_indexes

WORKERS_LIST_INDEX = "workers_list"
WORKERS_LIVE_INDEX = "workers_live"
WORKERS_TTL_INDEX = "workers_ttl"


def worker_indexes(retention: timedelta) -> list[IndexDef]:
    return [
        ([("start_time", 1), ("_id", 1)], {"name": WORKERS_LIST_INDEX}),
        ([("stop_time", 1), ("last_seen", 1)], {"name": WORKERS_LIVE_INDEX}),
        (
            [("last_seen", 1)],
            {"name": WORKERS_TTL_INDEX, "expireAfterSeconds": int(retention.total_seconds())},
        ),
    ]


class MongoWorkers:
    """Worker operations of ``MongoDriver`` (a mixin: it uses the driver's ``_call``)."""

    workers: Any
    worker_retention: timedelta

    if TYPE_CHECKING:

        async def _call(
            self,
            what: str,
            operation: Callable[[], Awaitable[T]],
            *,
            recover: Callable[[], Awaitable[T | None]] | None = None,
            session: Any = None,
        ) -> T: ...

    async def register_worker(self, info: WorkerInfo) -> bool:
        # One pipeline upsert, so that it reads and writes the registration atomically: one that
        # has not ended (no stop_time; e.g. an executor another API server registered first)
        # keeps its pending stop, start time and running count; a new one, or one after an
        # unregistration, starts afresh. A plain ``$set`` would wipe a stop an operator asked for.
        live = {
            "$and": [
                {"$ne": [{"$ifNull": ["$start_time", None]}, None]},
                {"$eq": [{"$ifNull": ["$stop_time", None]}, None]},
            ]
        }

        def kept(field: str, fresh: Any) -> dict[str, Any]:
            return {"$cond": [live, {"$ifNull": [f"${field}", literal(fresh)]}, literal(fresh)]}

        update = [
            {
                "$set": {
                    "host": literal(info.host),
                    "pid": literal(info.pid),
                    "names": literal(list(info.names)),
                    "groups": literal(list(info.groups)),
                    "concurrency": literal(info.concurrency),
                    "schemas": literal([{"name": name, "schema": text} for name, text in info.schemas]),
                    "start_time": kept("start_time", to_mongo(info.start_time)),
                    "last_seen": literal(to_mongo(info.start_time)),
                    "running_cnt": kept("running_cnt", 0),
                    "stop_requested": kept("stop_requested", False),
                    "stop_time": None,
                }
            }
        ]
        doc = await self._call(
            "register worker",
            lambda: self.workers.find_one_and_update(
                {"_id": info.worker_id},
                update,
                projection={"stop_requested": 1},
                upsert=True,
                return_document=ReturnDocument.AFTER,
            ),
        )
        return bool(doc and doc.get("stop_requested"))

    async def heartbeat_worker(self, worker_id: str, now: datetime, running_cnt: int) -> bool:
        doc = await self._call(
            "worker heartbeat",
            lambda: self.workers.find_one_and_update(
                {"_id": worker_id},
                {"$set": {"last_seen": to_mongo(now), "running_cnt": running_cnt}},
                projection={"stop_requested": 1},
                return_document=ReturnDocument.AFTER,
            ),
        )
        return bool(doc and doc.get("stop_requested"))

    async def request_worker_stop(self, worker_id: str, now: datetime) -> bool:
        result = await self._call(
            "request worker stop",
            lambda: self.workers.update_one(
                {"_id": worker_id, "stop_time": None},
                {"$set": {"stop_requested": True, "stop_request_time": to_mongo(now)}},
            ),
        )
        return bool(result.matched_count)

    async def unregister_worker(self, worker_id: str, now: datetime) -> None:
        await self._call(
            "unregister worker",
            lambda: self.workers.update_one(
                {"_id": worker_id},
                {"$set": {"stop_time": to_mongo(now), "last_seen": to_mongo(now), "running_cnt": 0}},
            ),
        )

    async def _create_worker_indexes(self) -> None:
        await ensure_indexes(self.workers, worker_indexes(self.worker_retention))

    async def list_workers(self, params: WorkerListParams | None = None) -> list[dict[str, Any]]:
        params = params or WorkerListParams()
        filter_: dict[str, Any] = {}
        if params.live_since is not None:
            filter_ = {"stop_time": None, "last_seen": {"$gte": to_mongo(params.live_since)}}
            sort, index = [("stop_time", 1), ("last_seen", 1)], WORKERS_LIVE_INDEX
        else:
            if params.now is not None:
                filter_["last_seen"] = {"$gte": to_mongo(params.now - self.worker_retention)}
            if params.after is not None:
                start, worker_id = to_mongo(params.after[0]), params.after[1]
                filter_["start_time"] = {"$gte": start}
                filter_["$or"] = [{"start_time": {"$gt": start}}, {"_id": {"$gt": worker_id}}]
            sort, index = [("start_time", 1), ("_id", 1)], WORKERS_LIST_INDEX

        async def read() -> list[dict[str, Any]]:
            projection = None if params.schemas else {"schemas": 0}  # schemas: only when asked
            cursor = self.workers.find(filter_, projection).sort(sort).limit(params.limit).hint(index)
            return [
                from_mongo({"worker_id": doc.pop("_id"), **doc})
                async for doc in cursor.max_time_ms(ADMIN_READ_MS)
            ]

        return await self._call("list workers", lambda: admin_read("list workers", read))
