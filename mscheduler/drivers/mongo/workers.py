"""Worker registry operations of ``MongoDriver`` (the workers collection): registration,
heartbeats with remote stop requests, listing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pymongo import ReturnDocument

from mscheduler.drivers.base import WorkerInfo
from mscheduler.drivers.mongo.common import T, _in, _lit, _out


class MongoWorkers:
    """Worker operations of ``MongoDriver`` (a mixin: it uses the driver's ``_call``)."""

    workers: Any

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
            return {"$cond": [live, {"$ifNull": [f"${field}", _lit(fresh)]}, _lit(fresh)]}

        update = [
            {
                "$set": {
                    "host": _lit(info.host),
                    "pid": _lit(info.pid),
                    "names": _lit(list(info.names)),
                    "groups": _lit(list(info.groups)),
                    "concurrency": _lit(info.concurrency),
                    "start_time": kept("start_time", _out(info.start_time)),
                    "last_seen": _lit(_out(info.start_time)),
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
                {"$set": {"last_seen": _out(now), "running_cnt": running_cnt}},
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
                {"$set": {"stop_requested": True, "stop_request_time": _out(now)}},
            ),
        )
        return bool(result.matched_count)

    async def unregister_worker(self, worker_id: str, now: datetime) -> None:
        await self._call(
            "unregister worker",
            lambda: self.workers.update_one(
                {"_id": worker_id},
                {"$set": {"stop_time": _out(now), "last_seen": _out(now), "running_cnt": 0}},
            ),
        )

    async def list_workers(self) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            cursor = self.workers.find({}).sort("start_time", 1)
            return [_in({"worker_id": doc.pop("_id"), **doc}) async for doc in cursor]

        return await self._call("list workers", read)
