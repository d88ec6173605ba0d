"""The Mongo driver's flow limits: the ``<prefix>mscheduler_limits`` collection.

Like ``driver.py`` / ``common.py``, one of the only modules that know the storage layout. A
limit's ``_id`` is its key; every change of its state is one ``find_one_and_update`` of that one
document by ``_id``, an update pipeline that reads the document's current state and writes the
new one atomically (``mscheduler.domain.limits.grant`` and ``settle`` written as stages; the
conformance suite checks that both drivers agree). The state is kept so that a write's cost does
not grow with the limit: ``slots`` is an object keyed by attempt token (a grant adds
fields, a release removes them, an extension changes one: the oplog delta is the size of the
change, where an array's removals shifted every later element and the server logged the whole
document), the rate's starts are counters per time bucket (``starts``: at most 1001 fields
whatever the rate), and replies are projected to the asked slots and a summary. The pipelines
still read the whole document (the server's CPU per write grows with the live slots, ~0.2-0.5 µs
each); the bytes written and returned do not. A slot's expiry is a date the caller computed,
compared with the caller's ``now``; bucket numbers are integer arithmetic.

Indexes (every read names its index with ``hint``):

================= ============================ ===========================================
``_id_``           ``_id``                      acquire, update_slots, get, delete, list
``limits_names``   ``names`` (unique, multikey) ``limit_keys`` (which limit covers a name);
                                                a name belongs to at most one limit
``limits_slots``   ``slots.$**`` (wildcard)     ``held_slots``: ``slots.<attempt>.w`` (which
                                                limit holds an attempt's slot: a ping or
                                                report on another API server)
================= ============================ ===========================================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pymongo import ReturnDocument, WriteConcern
from pymongo.errors import DuplicateKeyError

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.limits import (
    RATE_BUCKETS,
    acquire_result_fields,
    epoch_ms,
    granted_of,
    held_in,
    holder_id,
)
from mscheduler.drivers.base import (
    AcquireParams,
    AcquireResult,
    LimitNameTaken,
    LimitOfName,
    PutLimitParams,
    SlotsParams,
)
from mscheduler.drivers.mongo.common import ADMIN_READ_MS, admin_read, from_mongo, literal, to_mongo
from mscheduler.drivers.mongo.indexes import ensure_indexes

T = TypeVar("T")

LIMITS = "mscheduler_limits"
ID_INDEX = "_id_"
LIMITS_NAMES_INDEX = "limits_names"
LIMITS_SLOTS_INDEX = "limits_slots"
LIMIT_INDEXES: list[tuple[Any, dict[str, Any]]] = [
    ([("names", 1)], {"name": LIMITS_NAMES_INDEX, "unique": True}),
    # a wildcard index: slots are fields named by their attempt token (slots.<token>.w)
    ([("slots.$**", 1)], {"name": LIMITS_SLOTS_INDEX}),
]
# what an acquire's reply carries besides the asked slots (mscheduler.domain.limits.grant)
_SUMMARY = ("live", "retry_ms", "max_running", "rate_n")


def limits_collection(database: Any, prefix: str, concern: WriteConcern | None) -> Any:
    """The limits collection, with the tasks' write concern."""
    limits = database[f"{prefix}{LIMITS}"]
    return limits.with_options(write_concern=concern) if concern is not None else limits


def _null(field: str) -> dict[str, Any]:
    return {"$eq": [{"$ifNull": [f"${field}", None]}, None]}


def _not_in(path: str, values: Sequence[str]) -> dict[str, Any]:
    return {"$not": [{"$in": [path, literal(list(values))]}]}


def checked_tokens(tokens: Sequence[str]) -> list[str]:
    """Attempt tokens become field names of ``slots``: no dots, no leading ``$``, not empty."""
    bad = [t for t in tokens if not t or "." in t or t.startswith("$") or "\0" in t]
    if bad:
        raise InvalidInput(f"attempt tokens cannot name a slot: {bad[:3]}")
    return list(tokens)


# the slots as an array of {k, v} while a pipeline works on them
_SLOTS_IN = {"$objectToArray": {"$ifNull": ["$slots", {}]}}
_TEMPORARY: tuple[str, ...] = ("_w", "_slots_in", "_starts_in", "_keys", "_vals", "_cur", "_low", "_slots")
_TEMPORARY += (
    "_starts",
    "_start_keys",
    "_recent",
    "_room",
    "_granted",
    "_gone",
    "_pre_rate_gone",
    "_pre_rate_live",
    "_add",
)
# a slot granted while the limit had no rate (domain.limits.pre_rate_slot): b is null
_PRE_RATE_SLOT = {"$eq": [{"$ifNull": ["$$s.v.b", None]}, None]}


_RATED = {"$ne": [{"$ifNull": ["$rate_n", None]}, None]}
_PERIOD = "$rate_period_ms"


def acquire_pipeline(params: AcquireParams) -> list[dict[str, Any]]:
    """``mscheduler.domain.limits.grant`` as update stages, over the slots and the rate buckets as
    ``{k, v}`` arrays (``$objectToArray``), written back as objects: what changed is a few fields
    (the grants, the pruned slots, one bucket), so the write's oplog delta does not grow with the
    limit. Temporary fields start with ``_`` and are projected away at the end. The stages, in
    the domain's words: the rate window's buckets, the slots and starts that stay, the room and
    the grants, the limit written back."""
    mine = checked_tokens(params.attempts)
    return [
        *_window_stages(epoch_ms(params.now)),
        _kept_stage(params, mine),
        *_grant_stages(len(mine)),
        _written_stage(params, mine),
        {"$project": dict.fromkeys(_TEMPORARY, 0)},
    ]


def _window_stages(now_ms: int) -> list[dict[str, Any]]:
    """The rate's bucket width (``_w``), the current bucket (``_cur``), the first bucket of the
    window (``_low``) and the starts as ``{k, v}`` (``_starts_in``; counted with another width:
    all in the bucket of the latest, conservatively)."""
    rated, period = _RATED, _PERIOD
    as_long = {
        "$map": {
            "input": {"$objectToArray": {"$ifNull": ["$starts", {}]}},
            "as": "e",
            "in": {"$toLong": "$$e.k"},
        }
    }
    values = {"$map": {"input": {"$objectToArray": {"$ifNull": ["$starts", {}]}}, "as": "e", "in": "$$e.v"}}
    stage1 = {
        "$set": {
            "_w": {
                "$cond": [
                    rated,
                    {"$toLong": {"$max": [1, {"$floor": {"$divide": [period, RATE_BUCKETS]}}]}},
                    1,
                ]
            },
            "_slots_in": _SLOTS_IN,
            "_keys": as_long,
            "_vals": values,
        }
    }
    stage2 = {
        "$set": {
            "_cur": {"$toString": {"$toLong": {"$floor": {"$divide": [now_ms, "$_w"]}}}},
            "_low": {
                "$toLong": {
                    "$floor": {"$divide": [{"$subtract": [now_ms + 1, {"$ifNull": [period, 0]}]}, "$_w"]}
                }
            },
            "_starts_in": {
                "$cond": [
                    {
                        "$and": [
                            rated,
                            {"$gt": [{"$size": "$_keys"}, 0]},
                            {"$ne": [{"$ifNull": ["$starts_w", "$_w"]}, "$_w"]},
                        ]
                    },
                    # another width (the period changed): every start goes to the bucket of the
                    # latest (conservative)
                    [
                        {
                            "k": {
                                "$toString": {
                                    "$toLong": {
                                        "$floor": {
                                            "$divide": [
                                                {
                                                    "$subtract": [
                                                        {
                                                            "$multiply": [
                                                                {"$add": [{"$max": "$_keys"}, 1]},
                                                                {"$ifNull": ["$starts_w", 1]},
                                                            ]
                                                        },
                                                        1,
                                                    ]
                                                },
                                                "$_w",
                                            ]
                                        }
                                    }
                                }
                            },
                            "v": {"$sum": "$_vals"},
                        }
                    ],
                    {"$objectToArray": {"$ifNull": ["$starts", {}]}},
                ]
            },
        }
    }
    return [stage1, stage2]


def _kept_stage(params: AcquireParams, mine: list[str]) -> dict[str, Any]:
    """What stays: the live slots but this worker's ended ones and the asked attempts' earlier
    grants (``_slots``), the starts inside the window less the starts of those grants given back
    (``_starts``), and how many pre-rate slots leave now (``_pre_rate_gone``)."""
    ended = checked_tokens(params.release)
    ours = {"$eq": ["$$s.v.w", literal(holder_id(params.worker_id))]}
    stage3 = {
        "$set": {
            # pre-rate slots leaving now (expired, or released by this worker; not re-granted)
            "_pre_rate_gone": {
                "$size": {
                    "$filter": {
                        "input": "$_slots_in",
                        "as": "s",
                        "cond": {
                            "$and": [
                                _PRE_RATE_SLOT,
                                _not_in("$$s.k", mine),
                                {
                                    "$or": [
                                        {"$lte": ["$$s.v.e", literal(params.now)]},
                                        {"$and": [ours, {"$in": ["$$s.k", literal(ended)]}]},
                                    ]
                                },
                            ]
                        },
                    }
                }
            },
            "_slots": {
                "$filter": {
                    "input": "$_slots_in",
                    "as": "s",
                    "cond": {
                        "$and": [
                            {"$gt": ["$$s.v.e", literal(params.now)]},
                            _not_in("$$s.k", mine),
                            # this worker's ended attempts (release): their slots go, their
                            # starts stay counted
                            {"$eq": [{"$and": [ours, {"$in": ["$$s.k", literal(ended)]}]}, False]},
                        ]
                    },
                }
            },
            "_starts": _starts_kept(mine),
        }
    }
    return stage3


def _starts_kept(mine: list[str]) -> dict[str, Any]:
    """The rate's buckets inside the window, less the starts of the asked attempts' earlier
    grants (given back: they start again now); none without a rate."""
    given_back = {
        "$size": {
            "$filter": {
                "input": "$_slots_in",
                "as": "s",
                "cond": {"$and": [{"$in": ["$$s.k", literal(mine)]}, {"$eq": ["$$s.v.b", "$$e.k"]}]},
            }
        }
    }
    kept: dict[str, Any] = {
        "$cond": [
            _RATED,
            {
                "$filter": {
                    "input": {
                        "$map": {
                            "input": {
                                "$filter": {
                                    "input": "$_starts_in",
                                    "as": "e",
                                    "cond": {"$gte": [{"$toLong": "$$e.k"}, "$_low"]},
                                }
                            },
                            "as": "e",
                            "in": {"k": "$$e.k", "v": {"$subtract": ["$$e.v", given_back]}},
                        }
                    },
                    "as": "e",
                    "cond": {"$gt": ["$$e.v", 0]},
                }
            },
            [],
        ]
    }
    return kept


def _grant_stages(k: int) -> list[dict[str, Any]]:
    """The starts in the window (``_recent``: live pre-rate slots count while the limit has a
    rate), the room left under ``max_running`` and the rate for ``k`` asked attempts, the grants
    (``_granted``) and what the current bucket gains (``_add``)."""
    rated = _RATED
    stage4 = {
        "$set": {
            "_start_keys": {"$map": {"input": "$_starts", "as": "e", "in": {"$toLong": "$$e.k"}}},
            "_pre_rate_live": {"$size": {"$filter": {"input": "$_slots", "as": "s", "cond": _PRE_RATE_SLOT}}},
        }
    }
    # live pre-rate slots count as starts while the limit has a rate
    counts = {"$sum": {"$map": {"input": "$_starts", "as": "e", "in": "$$e.v"}}}
    stage5 = {
        "$set": {
            "_recent": {
                "$add": [counts, {"$cond": [rated, {"$add": ["$_pre_rate_live", "$_pre_rate_gone"]}, 0]}]
            }
        }
    }
    room = {
        "$min": [
            k,
            {"$cond": [_null("max_running"), k, {"$subtract": ["$max_running", {"$size": "$_slots"}]}]},
            {"$cond": [rated, {"$subtract": ["$rate_n", "$_recent"]}, k]},
        ]
    }
    stage6 = {"$set": {"_room": room}}
    stage7 = {"$set": {"_granted": {"$max": [0, "$_room"]}}}
    # what the current bucket gains: the grants' starts and those of the pre-rate slots leaving
    stage7b = {"$set": {"_add": {"$add": ["$_granted", {"$cond": [rated, "$_pre_rate_gone", 0]}]}}}
    return [stage4, stage5, stage6, stage7, stage7b]


def _written_stage(params: AcquireParams, mine: list[str]) -> dict[str, Any]:
    """The limit written back as objects: the kept slots and the granted ones, the bumped
    buckets, and the summary the reply is projected to (``live``, ``recent``, ``retry_ms``)."""
    rated, period = _RATED, _PERIOD
    asked = [{"a": a, "i": i} for i, a in enumerate(mine)]
    picked = {"$filter": {"input": literal(asked), "as": "r", "cond": {"$lt": ["$$r.i", "$_room"]}}}
    new_slots = {
        "$map": {
            "input": picked,
            "as": "r",
            "in": {
                "k": "$$r.a",
                "v": {
                    "w": literal(holder_id(params.worker_id)),
                    "e": literal(params.expire),
                    "b": {"$cond": [rated, "$_cur", None]},
                },
            },
        }
    }
    keys_now = {"$map": {"input": "$_starts", "as": "e", "in": "$$e.k"}}
    bumped = {
        "$concatArrays": [
            {
                "$map": {
                    "input": "$_starts",
                    "as": "e",
                    "in": {
                        "k": "$$e.k",
                        "v": {"$cond": [{"$eq": ["$$e.k", "$_cur"]}, {"$add": ["$$e.v", "$_add"]}, "$$e.v"]},
                    },
                }
            },
            {
                "$cond": [
                    {"$and": [{"$gt": ["$_add", 0]}, {"$eq": [{"$in": ["$_cur", keys_now]}, False]}]},
                    [{"k": "$_cur", "v": "$_add"}],
                    [],
                ]
            },
        ]
    }
    recent = {"$add": ["$_recent", "$_granted"]}
    # the bumped buckets are not empty (the domain's ``starts``, after the grant)
    counted = {"$or": [{"$gt": [{"$size": "$_starts"}, 0]}, {"$gt": ["$_add", 0]}]}
    oldest = {"$ifNull": [{"$min": "$_start_keys"}, {"$toLong": "$_cur"}]}
    stage8 = {
        "$set": {
            "slots": {"$arrayToObject": {"$concatArrays": ["$_slots", new_slots]}},
            "starts": {"$cond": [rated, {"$arrayToObject": bumped}, {}]},
            "starts_w": {"$cond": [rated, "$_w", None]},
            "live": {"$add": [{"$size": "$_slots"}, "$_granted"]},
            "recent": {"$cond": [rated, recent, 0]},
            "retry_ms": {
                "$cond": [
                    {"$and": [rated, counted, {"$gte": [recent, "$rate_n"]}]},
                    {"$subtract": [{"$add": [{"$multiply": [{"$add": [oldest, 1]}, "$_w"]}, period]}, 1]},
                    None,
                ]
            },
        }
    }
    return stage8


def slots_pipeline(params: SlotsParams) -> list[dict[str, Any]]:
    """``mscheduler.domain.limits.settle`` as update stages (see ``acquire_pipeline``)."""
    holder = literal(holder_id(params.worker_id))
    dropped = checked_tokens([*params.release, *params.unused])
    ext_keys = checked_tokens(list(params.extend))
    ours = {"$eq": ["$$s.v.w", holder]}
    live = {"$gt": ["$$s.v.e", literal(params.now)]}
    # on a limit with a rate, a slot granted before it had one stays until the next acquire
    # counts its start (domain.limits.settle): a released one is ended (expiry now at the latest)
    pre = {"$and": [{"$ne": [{"$ifNull": ["$rate_n", None]}, None]}, _PRE_RATE_SLOT]}
    keep = {
        "$cond": [
            pre,
            {"$eq": [{"$and": [ours, {"$in": ["$$s.k", literal(checked_tokens(params.unused))]}]}, False]},
            {"$and": [live, {"$eq": [{"$and": [ours, {"$in": ["$$s.k", literal(dropped)]}]}, False]}]},
        ]
    }
    # the new expiry of slot ``$$s``: the one given for its attempt token
    expiries = literal([params.extend[a] for a in ext_keys])
    moved = {"$arrayElemAt": [expiries, {"$indexOfArray": [literal(ext_keys), "$$s.k"]}]}
    extended = {"w": "$$s.v.w", "e": moved, "b": "$$s.v.b"}
    ended = {"w": "$$s.v.w", "e": {"$min": ["$$s.v.e", literal(params.now)]}, "b": None}
    value = {
        "$switch": {
            "branches": [
                {"case": {"$and": [pre, ours, {"$in": ["$$s.k", literal(dropped)]}]}, "then": ended},
                {"case": {"$and": [ours, live, {"$in": ["$$s.k", literal(ext_keys)]}]}, "then": extended},
            ],
            "default": "$$s.v",
        }
    }
    fields: dict[str, Any] = {
        "slots": {
            "$arrayToObject": {
                "$map": {
                    "input": {"$filter": {"input": "$_slots_in", "as": "s", "cond": keep}},
                    "as": "s",
                    "in": {"k": "$$s.k", "v": value},
                }
            }
        }
    }
    stages: list[dict[str, Any]] = [{"$set": {"_slots_in": _SLOTS_IN}}]
    if params.unused:
        # an unused grant gives its start back (nothing started)
        gone = {
            "$map": {
                "input": {
                    "$filter": {
                        "input": "$_slots_in",
                        "as": "s",
                        "cond": {"$and": [ours, {"$in": ["$$s.k", literal(checked_tokens(params.unused))]}]},
                    }
                },
                "as": "s",
                "in": "$$s.v.b",
            }
        }
        stages.append({"$set": {"_gone": gone}})
        back = {"$size": {"$filter": {"input": "$_gone", "as": "b", "cond": {"$eq": ["$$b", "$$e.k"]}}}}
        fields["starts"] = {
            "$arrayToObject": {
                "$filter": {
                    "input": {
                        "$map": {
                            "input": {"$objectToArray": {"$ifNull": ["$starts", {}]}},
                            "as": "e",
                            "in": {"k": "$$e.k", "v": {"$subtract": ["$$e.v", back]}},
                        }
                    },
                    "as": "e",
                    "cond": {"$gt": ["$$e.v", 0]},
                }
            }
        }
    stages.append({"$set": fields})
    stages.append({"$project": {"_slots_in": 0, "_gone": 0}})
    return stages


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
            "$set": to_mongo({**params.fields, "update_time": params.now}),
            "$setOnInsert": to_mongo({"slots": {}, "starts": {}, "create_time": params.now}),
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
        # against a concurrent put.
        await holder()
        for _ in range(2):  # an upsert racing another of the same new key: once more
            try:
                return await self._call("put limit", write)
            except DuplicateKeyError:
                await holder()
        raise LimitNameTaken(params.key)

    async def get_limit(self, key: str) -> dict[str, Any] | None:
        doc = await self._call("get limit", lambda: self.limits.find_one({"_id": key}))
        return from_mongo(doc) if doc is not None else None

    async def list_limits(self) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            cursor = self.limits.find({}).sort("_id", 1).hint(ID_INDEX)
            return [from_mongo(doc) async for doc in cursor.max_time_ms(ADMIN_READ_MS)]

        return await self._call("list limits", lambda: admin_read("list limits", read))

    async def delete_limit(self, key: str) -> bool:
        result = await self._call("delete limit", lambda: self.limits.delete_one({"_id": key}))
        return bool(result.deleted_count)

    async def limit_keys(self, names: Sequence[str]) -> dict[str, LimitOfName]:
        async def read() -> dict[str, LimitOfName]:
            cursor = self.limits_primary.find(
                {"names": {"$in": list(names)}}, {"names": 1, "rate_n": 1}
            ).hint(LIMITS_NAMES_INDEX)
            return {
                n: LimitOfName(doc["_id"], doc.get("rate_n") is not None)
                async for doc in cursor
                for n in doc["names"]
                if n in names
            }

        return await self._call("read limit keys", read)

    async def held_slots(self, worker_id: str, attempts: Sequence[str], now: datetime) -> dict[str, str]:
        tokens = checked_tokens(attempts)
        holder = holder_id(worker_id)

        async def read() -> dict[str, str]:
            # from the primary: a lagging secondary may not have the slot yet, and a renewal
            # that skips it lets the lease outlive its slot (max_running exceeded). One branch
            # per attempt, each on the wildcard index limits_slots (slots.<attempt>.w); only
            # those slots are fetched back.
            branches: list[dict[str, Any]] = [{f"slots.{a}.w": holder} for a in tokens]
            filter_ = {"$or": branches}
            projection = {f"slots.{a}": 1 for a in tokens}
            cursor = self.limits_primary.find(filter_, projection).hint(LIMITS_SLOTS_INDEX)
            return held_in([from_mongo(doc) async for doc in cursor], worker_id, tokens, now)

        if not tokens:
            return {}
        return await self._call("read held slots", read)

    async def acquire_slots(self, params: AcquireParams) -> AcquireResult:
        pipeline = acquire_pipeline(params)

        # the reply: the asked attempts' slots and the summary the grant wrote, not the limit
        projection = {f"slots.{a}": 1 for a in params.attempts} | dict.fromkeys(_SUMMARY, 1)

        async def write() -> dict[str, Any] | None:
            doc: dict[str, Any] | None = await self.limits.find_one_and_update(
                {"_id": params.key},
                pipeline,
                projection=projection,
                return_document=ReturnDocument.AFTER,
                hint=ID_INDEX,
            )
            return doc

        async def recover() -> dict[str, Any] | None:
            # the reply was lost: applied if one of our attempts holds a slot (a retry of an
            # acquire is harmless anyway: it drops these attempts' grants before granting)
            doc: dict[str, Any] | None = await self.limits_primary.find_one({"_id": params.key}, projection)
            if doc is None or not granted_of(from_mongo(doc), params.worker_id, params.attempts, params.now):
                return None
            return doc

        doc = await self._call("acquire slots", write, recover=recover)
        if doc is None:
            return AcquireResult(granted=list(params.attempts), limited=False)
        doc = from_mongo(doc)
        return AcquireResult(
            granted=granted_of(doc, params.worker_id, params.attempts, params.now),
            **acquire_result_fields(doc, params.now),
        )

    async def update_slots(self, params: SlotsParams) -> list[str]:
        pipeline = slots_pipeline(params)

        projection = {f"slots.{a}": 1 for a in params.extend} or {"_id": 1}

        async def write() -> dict[str, Any] | None:
            doc: dict[str, Any] | None = await self.limits.find_one_and_update(
                {"_id": params.key},
                pipeline,
                projection=projection,
                return_document=ReturnDocument.AFTER,
                hint=ID_INDEX,
            )
            return doc

        # idempotent: a retry after a lost reply releases and extends the same way again; named
        # by what it does, for the command counts (benchmarks/commands_per_task.py)
        what = "settle slots" if params.unused else "extend slots" if params.extend else "release slots"
        doc = await self._call(what, write)
        if doc is None:
            return list(params.extend)
        return granted_of(from_mongo(doc), params.worker_id, list(params.extend), params.now)
