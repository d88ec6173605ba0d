"""The Mongo driver's flow limits (SPEC G5): the ``<prefix>mscheduler_limits`` collection.

Like ``mongo.py`` / ``mongo_common.py``, one of the only modules that know the storage layout. A
limit's ``_id`` is its key; every change of its state (``slots``, ``starts``) is one
``find_one_and_update`` of that one document by ``_id``, an update pipeline that reads the
document's current state and writes the new one atomically (``mscheduler.domain.limits.grant`` and
``settle`` written as stages; the conformance suite checks that both drivers agree). No date
arithmetic in the pipelines (mongomock has none): a slot's expiry is a date compared with the
caller's ``now``; a start's time is stored in epoch milliseconds, so the window's lower edge is
integer arithmetic on the stored period.

Indexes (every read names its index with ``hint``):

================= ============================ ===========================================
``_id_``           ``_id``                      acquire, update_slots, get, delete, list
``limits_names``   ``names`` (unique, multikey) ``limit_keys`` (which limit covers a name);
                                                a name belongs to at most one limit
``limits_slots``   ``slots.a`` (multikey)       ``held_slots`` (which limit holds an attempt's
                                                slot: a ping or report on another API server)
================= ============================ ===========================================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pymongo import ReturnDocument, WriteConcern
from pymongo.errors import DuplicateKeyError

from mscheduler.domain.limits import acquire_result_fields, epoch_ms, granted_of, held_in
from mscheduler.drivers.base import AcquireParams, AcquireResult, LimitNameTaken, PutLimitParams, SlotsParams
from mscheduler.drivers.mongo.common import _in, _lit, _out
from mscheduler.drivers.mongo.indexes import ensure_indexes

T = TypeVar("T")

LIMITS = "mscheduler_limits"
ID_INDEX = "_id_"
LIMITS_NAMES_INDEX = "limits_names"
LIMITS_SLOTS_INDEX = "limits_slots"
LIMIT_INDEXES: list[tuple[Any, dict[str, Any]]] = [
    ([("names", 1)], {"name": LIMITS_NAMES_INDEX, "unique": True}),
    ([("slots.a", 1)], {"name": LIMITS_SLOTS_INDEX}),
]


def limits_collection(database: Any, prefix: str, concern: WriteConcern | None) -> Any:
    """The limits collection, with the tasks' write concern."""
    limits = database[f"{prefix}{LIMITS}"]
    return limits.with_options(write_concern=concern) if concern is not None else limits


def _null(field: str) -> dict[str, Any]:
    return {"$eq": [{"$ifNull": [f"${field}", None]}, None]}


def _not_in(path: str, values: Sequence[str]) -> dict[str, Any]:
    # ``$eq ... false``, not ``$not``: mongomock evaluates ``$not`` of ``$in`` wrongly
    return {"$eq": [{"$in": [path, _lit(list(values))]}, False]}


def acquire_pipeline(params: AcquireParams) -> list[dict[str, Any]]:
    """``mscheduler.domain.limits.grant`` as update stages: prune, then grant ``room`` attempts."""
    k = len(params.attempts)
    now_ms = epoch_ms(params.now)
    mine = list(params.attempts)
    live = {"$and": [{"$gt": ["$$s.e", _lit(params.now)]}, _not_in("$$s.a", mine)]}
    in_window = {
        "$and": [{"$gt": ["$$s.t", {"$subtract": [now_ms, "$rate_period_ms"]}]}, _not_in("$$s.a", mine)]
    }
    prune = {
        "$set": {
            "slots": {"$filter": {"input": {"$ifNull": ["$slots", []]}, "as": "s", "cond": live}},
            "starts": {
                "$cond": [
                    _null("rate_n"),
                    [],
                    {"$filter": {"input": {"$ifNull": ["$starts", []]}, "as": "s", "cond": in_window}},
                ]
            },
        }
    }
    room = {
        "$min": [
            k,
            {"$cond": [_null("max_running"), k, {"$subtract": ["$max_running", {"$size": "$slots"}]}]},
            {"$cond": [_null("rate_n"), k, {"$subtract": ["$rate_n", {"$size": "$starts"}]}]},
        ]
    }
    asked = [{"a": a, "w": params.worker_id, "e": params.expire, "i": i} for i, a in enumerate(mine)]
    picked = {"$filter": {"input": _lit(asked), "as": "r", "cond": {"$lt": ["$$r.i", "$$room"]}}}
    slots = {"$map": {"input": picked, "as": "r", "in": {"a": "$$r.a", "w": "$$r.w", "e": "$$r.e"}}}
    starts = {"$map": {"input": picked, "as": "r", "in": {"a": "$$r.a", "t": now_ms}}}
    add = {
        "$set": {
            "slots": {"$let": {"vars": {"room": room}, "in": {"$concatArrays": ["$slots", slots]}}},
            "starts": {
                "$cond": [
                    _null("rate_n"),
                    [],
                    {"$let": {"vars": {"room": room}, "in": {"$concatArrays": ["$starts", starts]}}},
                ]
            },
        }
    }
    return [prune, add]


def slots_pipeline(params: SlotsParams) -> list[dict[str, Any]]:
    """``mscheduler.domain.limits.settle`` as one update stage."""
    worker = _lit(params.worker_id)
    dropped = [*params.release, *params.unused]
    ext_keys = list(params.extend)
    ext_vals = [params.extend[a] for a in ext_keys]
    ours = {"$eq": ["$$s.w", worker]}
    keep = {
        "$and": [
            {"$gt": ["$$s.e", _lit(params.now)]},
            {"$eq": [{"$and": [ours, {"$in": ["$$s.a", _lit(dropped)]}]}, False]},
        ]
    }
    # the new expiry of slot ``$$s`` from the literal pairs (no ``$indexOfArray`` in mongomock)
    pairs = [{"a": a, "e": e} for a, e in zip(ext_keys, ext_vals, strict=True)]
    match = {"$filter": {"input": _lit(pairs), "as": "x", "cond": {"$eq": ["$$x.a", "$$s.a"]}}}
    moved = {"$let": {"vars": {"m": {"$arrayElemAt": [match, 0]}}, "in": "$$m.e"}}
    expire = {"$cond": [{"$and": [ours, {"$in": ["$$s.a", _lit(ext_keys)]}]}, moved, "$$s.e"]}
    fields: dict[str, Any] = {
        "slots": {
            "$map": {
                "input": {"$filter": {"input": {"$ifNull": ["$slots", []]}, "as": "s", "cond": keep}},
                "as": "s",
                "in": {"a": "$$s.a", "w": "$$s.w", "e": expire},
            }
        }
    }
    if params.unused:
        fields["starts"] = {
            "$filter": {
                "input": {"$ifNull": ["$starts", []]},
                "as": "s",
                "cond": _not_in("$$s.a", params.unused),
            }
        }
    return [{"$set": fields}]


class MongoLimits:
    """Limit operations of ``MongoDriver`` (a mixin: it uses the driver's ``_call``)."""

    limits: Any
    limits_primary: Any  # the same collection, read from the primary (see held_slots)

    if TYPE_CHECKING:

        async def _call(
            self,
            what: str,
            operation: Callable[[], Awaitable[T]],
            *,
            recover: Callable[[], Awaitable[T | None]] | None = None,
            session: Any = None,
        ) -> T: ...

    async def _create_limit_indexes(self) -> None:
        await ensure_indexes(self.limits, LIMIT_INDEXES)

    async def put_limit(self, params: PutLimitParams) -> bool:
        update = {
            "$set": _out({**params.fields, "update_time": params.now}),
            "$setOnInsert": _out({"slots": [], "starts": [], "create_time": params.now}),
        }

        async def write() -> bool:
            result = await self.limits.update_one({"_id": params.key}, update, upsert=True)
            return result.upserted_id is not None

        async def holder() -> None:
            names = list(params.fields["names"])

            async def read() -> dict[str, Any] | None:
                filter_ = {"names": {"$in": names}, "_id": {"$ne": params.key}}
                cursor = self.limits.find(filter_, {"names": 1}).limit(1).hint(LIMITS_NAMES_INDEX)
                docs = [doc async for doc in cursor]
                return docs[0] if docs else None

            found = await self._call("put limit (who holds the names)", read)
            if found is not None:
                taken = next((n for n in names if n in found["names"]), None)
                raise LimitNameTaken(params.key, taken, found["_id"])

        # A read first gives the clear refusal; the unique index ``limits_names`` is what holds
        # against a concurrent put (mongomock does not enforce it on updates: the read is its
        # only guard there).
        await holder()
        for _ in range(2):  # an upsert racing another of the same new key: once more
            try:
                return await self._call("put limit", write)
            except DuplicateKeyError:
                await holder()
        raise LimitNameTaken(params.key)

    async def get_limit(self, key: str) -> dict[str, Any] | None:
        doc = await self._call("get limit", lambda: self.limits.find_one({"_id": key}))
        return _in(doc) if doc is not None else None

    async def list_limits(self) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            cursor = self.limits.find({}).sort("_id", 1).hint(ID_INDEX)
            return [_in(doc) async for doc in cursor]

        return await self._call("list limits", read)

    async def delete_limit(self, key: str) -> bool:
        result = await self._call("delete limit", lambda: self.limits.delete_one({"_id": key}))
        return bool(result.deleted_count)

    async def limit_keys(self, names: Sequence[str]) -> dict[str, str]:
        async def read() -> dict[str, str]:
            cursor = self.limits_primary.find({"names": {"$in": list(names)}}, {"names": 1}).hint(
                LIMITS_NAMES_INDEX
            )
            return {n: doc["_id"] async for doc in cursor for n in doc["names"] if n in names}

        return await self._call("read limit keys", read)

    async def held_slots(self, worker_id: str, attempts: Sequence[str], now: datetime) -> dict[str, str]:
        async def read() -> dict[str, str]:
            # from the primary: a lagging secondary may not have the slot yet, and a renewal
            # that skips it lets the lease outlive its slot (max_running exceeded)
            filter_ = {"slots.a": {"$in": list(attempts)}}
            cursor = self.limits_primary.find(filter_, {"slots": 1}).hint(LIMITS_SLOTS_INDEX)
            return held_in([_in(doc) async for doc in cursor], worker_id, attempts, now)

        return await self._call("read held slots", read)

    async def acquire_slots(self, params: AcquireParams) -> AcquireResult:
        pipeline = acquire_pipeline(params)

        async def write() -> dict[str, Any] | None:
            doc: dict[str, Any] | None = await self.limits.find_one_and_update(
                {"_id": params.key}, pipeline, return_document=ReturnDocument.AFTER, hint=ID_INDEX
            )
            return doc

        async def recover() -> dict[str, Any] | None:
            # the reply was lost: applied if one of our attempts holds a slot (a retry of an
            # acquire is harmless anyway: it drops these attempts' grants before granting)
            doc: dict[str, Any] | None = await self.limits_primary.find_one({"_id": params.key})
            if doc is None or not granted_of(_in(doc), params.worker_id, params.attempts, params.now):
                return None
            return doc

        doc = await self._call("acquire slots", write, recover=recover)
        if doc is None:
            return AcquireResult(granted=list(params.attempts), limited=False)
        doc = _in(doc)
        return AcquireResult(
            granted=granted_of(doc, params.worker_id, params.attempts, params.now),
            **acquire_result_fields(doc, params.now),
        )

    async def update_slots(self, params: SlotsParams) -> list[str]:
        pipeline = slots_pipeline(params)

        async def write() -> dict[str, Any] | None:
            doc: dict[str, Any] | None = await self.limits.find_one_and_update(
                {"_id": params.key}, pipeline, return_document=ReturnDocument.AFTER, hint=ID_INDEX
            )
            return doc

        # idempotent: a retry after a lost reply releases and extends the same way again; named
        # by what it does, for the command counts (benchmarks/commands_per_task.py)
        what = "settle slots" if params.unused else "extend slots" if params.extend else "release slots"
        doc = await self._call(what, write)
        if doc is None:
            return list(params.extend)
        held = _live_of(_in(doc), params.worker_id, params.now)
        return [a for a in params.extend if a in held]


def _live_of(doc: dict[str, Any], worker_id: str, now: datetime) -> set[str]:
    return {s["a"] for s in doc.get("slots", []) if s["w"] == worker_id and s["e"] > now}
