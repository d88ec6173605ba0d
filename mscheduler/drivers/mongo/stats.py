"""Statistics of ``MongoDriver`` as aggregation pipelines; definitions in
``mscheduler.domain.stats``, the same numbers in Python in ``memory_stats.py`` (one conformance test).

Two aggregations, each read through a named index of ``mongo_common.INDEXES`` (``hint``), so
that neither grows with the finished tasks outside the window:

* ``stats_counts`` (``name, state.status, state.claim_at``): counts by name and status, and the
  earliest due time of due pending tasks per name. Covered: only index keys are read, no
  document. Asked for some statuses (the metrics' gauges ask for pending and running), the scan
  seeks from status range to status range: it reads the keys of those tasks only.
* ``finished_key`` (``state.status, state.finish_time, key``; it also serves the finished
  listing): the tasks finished since ``min(now - window, start of the throughput hour)``, the
  only documents fetched (a ``names`` filter is checked on them: the index does not hold the
  name); one ``$facet`` computes the window's counts, the duration percentiles and the
  per-minute throughput from them.

Percentiles: MongoDB 7's ``$percentile`` is approximate (and 5.0 / 6.0 lack it), so durations
are counted per distinct value and sorted per name, and the nearest ranks found by a running count
(``$reduce``): exact, the same on every server, and bounded by the distinct durations of the
window (``allowDiskUse`` for the sort).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mscheduler.domain.fairness import KeyWait
from mscheduler.domain.stats import (
    COUNT_STEP,
    FINISHED_STATUSES,
    PERCENTILES,
    WINDOW_STEP,
    RawStats,
    StatsStep,
    TaskStats,
    assemble,
    finished_range,
    hour_start,
)
from mscheduler.drivers.base import KeyWaitParams, StatsParams
from mscheduler.drivers.mongo.common import (
    ADMIN_READ_MS,
    ALL_STATUSES,
    FINISHED_INDEX,
    LANES_INDEX,
    STATS_COUNTS_INDEX,
    WORKER_STATES,
    T,
    admin_read,
    from_mongo,
    literal,
    resolved,
    to_mongo,
)


def counts_pipeline(params: StatsParams) -> list[dict[str, Any]]:
    """Counts by (name, status) and, per name, the earliest ``claim_at`` of due pending tasks
    (``$min`` skips the nulls of the other tasks). Only indexed fields: a covered plan."""
    match: dict[str, Any] = {"state.status": {"$in": list(params.statuses or ALL_STATUSES)}}
    if params.names is not None:
        match = {"name": {"$in": list(params.names)}, **match}
    claim_at = "$state.claim_at"
    due = {
        "$and": [
            {"$eq": ["$state.status", "pending"]},
            {"$ne": [{"$ifNull": [claim_at, None]}, None]},  # null sorts below every date
            {"$lte": [claim_at, literal(params.now)]},
        ]
    }
    return [
        {"$match": match},
        {
            "$group": {
                "_id": {"name": "$name", "status": "$state.status"},
                "n": {"$sum": 1},
                "due": {"$min": {"$cond": [due, claim_at, None]}},
            }
        },
    ]


def _durations_facet(in_window: dict[str, Any]) -> list[dict[str, Any]]:
    """Per name, the duration at each percentile's nearest rank (``stats.rank_index``: the value
    at ``ceil(p * n / 100)`` in the sorted durations). The durations are first counted per
    distinct value, so a name's $group holds one {duration, count} per distinct duration (at
    millisecond precision), not one value per attempt: the 100 MB a $group may hold is reached by
    no number of tasks of a few thousand distinct durations. The ranks are then found by a
    running count over the sorted values."""

    def at_rank(p: int) -> dict[str, Any]:  # the first value whose running count reaches the rank
        rank = {"$ceil": {"$divide": [{"$multiply": ["$n", p]}, 100]}}
        step = {
            "c": {"$add": ["$$value.c", "$$this.c"]},
            "v": {
                "$cond": [
                    {
                        "$and": [
                            {"$eq": ["$$value.v", None]},
                            {"$gte": [{"$add": ["$$value.c", "$$this.c"]}, rank]},
                        ]
                    },
                    "$$this.d",
                    "$$value.v",
                ]
            },
        }
        return {"$reduce": {"input": "$h", "initialValue": {"c": 0, "v": None}, "in": step}}

    by_value = {"$push": {"d": "$_id.d", "c": "$c"}}
    at_ranks = {f"p{p}": {"$let": {"vars": {"r": at_rank(p)}, "in": "$$r.v"}} for p in PERCENTILES}
    return [
        in_window,
        {"$unwind": "$ok"},
        {"$group": {"_id": {"name": "$name", "d": "$ok"}, "c": {"$sum": 1}}},
        {"$sort": {"_id.name": 1, "_id.d": 1}},
        {"$group": {"_id": "$_id.name", "h": by_value, "n": {"$sum": "$c"}}},
        {"$project": {"n": 1, **at_ranks}},
    ]


def finished_pipeline(params: StatsParams) -> list[dict[str, Any]]:
    """The finished tasks' part: one pass over the tasks finished since the earlier of the
    window's and the throughput hour's starts."""
    assert params.window is not None
    low, high = finished_range(params.now, params.window)
    window_start = to_mongo(params.now - params.window)
    first_bucket = to_mongo(hour_start(params.now))
    match: dict[str, Any] = {"state.finish_time": {"$gte": to_mongo(low), "$lte": to_mongo(high)}}
    if params.names is not None:
        match["name"] = {"$in": list(params.names)}
    match["state.status"] = {"$in": list(FINISHED_STATUSES)}  # one index range per status

    succeeded_entries = {
        "$filter": {"input": f"${WORKER_STATES}", "as": "e", "cond": {"$eq": ["$$e.status", "succeeded"]}}
    }
    succeeded = {"$eq": ["$status", "succeeded"]}
    others = {"$subtract": ["$entries", {"$size": "$ok"}]}

    def count_if(cond: dict[str, Any]) -> dict[str, Any]:
        return {"$sum": {"$cond": [cond, 1, 0]}}

    in_window = {"$match": {"finish": {"$gte": window_start}}}
    minute = {"$floor": {"$divide": [{"$subtract": ["$finish", {"$literal": first_bucket}]}, 60_000]}}
    return [
        {"$match": match},
        {
            "$project": {
                "_id": 0,
                "name": 1,
                "status": "$state.status",
                "finish": "$state.finish_time",
                "entries": {"$size": f"${WORKER_STATES}"},
                "ok": {
                    "$map": {
                        "input": succeeded_entries,
                        "as": "e",
                        "in": {"$subtract": ["$$e.end_time", "$$e.start_time"]},  # milliseconds
                    }
                },
            }
        },
        {
            "$facet": {
                "window": [
                    in_window,
                    {
                        "$group": {
                            "_id": "$name",
                            "finished": {"$sum": 1},
                            "succeeded": count_if(succeeded),
                            "first": count_if(
                                {"$and": [succeeded, {"$gt": [{"$size": "$ok"}, 0]}, {"$eq": [others, 0]}]}
                            ),
                            "second": count_if(
                                {"$and": [succeeded, {"$gt": [{"$size": "$ok"}, 0]}, {"$eq": [others, 1]}]}
                            ),
                        }
                    },
                ],
                "durations": _durations_facet(in_window),
                "throughput": [
                    {"$match": {"finish": {"$gte": first_bucket}}},
                    {
                        "$group": {
                            "_id": {"bucket": minute, "status": "$status"},
                            "n": {"$sum": 1},
                        }
                    },
                ],
            }
        },
    ]


class MongoStats:
    """``task_stats`` of ``MongoDriver`` (a mixin: it uses the driver's ``_call`` and ``tasks``)."""

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

    async def _aggregate(self, what: str, pipeline: list[dict[str, Any]], index: str) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            cursor = await resolved(
                self.tasks.aggregate(pipeline, hint=index, allowDiskUse=True, maxTimeMS=ADMIN_READ_MS)
            )
            return [from_mongo(doc) async for doc in cursor]

        return await self._call(what, lambda: admin_read(what, read))

    async def key_waits(self, params: KeyWaitParams) -> list[KeyWait]:
        """One aggregation over the partial ``lanes`` index (``option.fair_key, name,
        state.claim_at``): the due tasks' keys grouped by fairness key (covered: index keys only,
        one per due task with a key; tasks without one are not in the index)."""
        now = to_mongo(params.now)
        match: dict[str, Any] = {
            "option.fair_key": {"$exists": True, "$type": "string"},
            "state.claim_at": {"$lte": now},
        }
        if params.names is not None:
            match["name"] = {"$in": list(params.names)}
        pipeline: list[dict[str, Any]] = [
            {"$match": match},
            {
                "$group": {
                    "_id": "$option.fair_key",
                    "due": {"$sum": 1},
                    "oldest": {"$min": "$state.claim_at"},
                }
            },
            {"$sort": {"oldest": 1, "_id": 1}},
            {"$limit": params.limit},
        ]
        rows = await self._aggregate("fairness keys' waits", pipeline, LANES_INDEX)
        return [
            KeyWait(
                key=row["_id"],
                due=row["due"],
                oldest_wait=max((params.now - row["oldest"]).total_seconds(), 0.0),
            )
            for row in rows
        ]

    async def task_stats(self, params: StatsParams, on_step: StatsStep | None = None) -> TaskStats:
        raw = RawStats()
        if on_step is not None:
            on_step(COUNT_STEP)
        for row in await self._aggregate("count tasks", counts_pipeline(params), STATS_COUNTS_INDEX):
            name, status = row["_id"]["name"], row["_id"]["status"]
            raw.counts[(name, status)] = row["n"]
            if row.get("due") is not None:
                raw.oldest_due[name] = row["due"]
        if params.window is not None:
            if on_step is not None:
                on_step(WINDOW_STEP)
            pipeline = finished_pipeline(params)
            rows = await self._aggregate("finished tasks", pipeline, FINISHED_INDEX)
            facets = rows[0] if rows else {}
            for row in facets.get("window", []):
                raw.finished[row["_id"]] = [row["finished"], row["succeeded"], row["first"], row["second"]]
            for row in facets.get("durations", []):
                raw.durations[row["_id"]] = (row["n"], {p: int(row[f"p{p}"]) for p in PERCENTILES})
            for row in facets.get("throughput", []):
                raw.throughput[(int(row["_id"]["bucket"]), row["_id"]["status"])] = row["n"]
        statuses = tuple(params.statuses) if params.statuses is not None else None
        return assemble(raw, params.now, params.window, statuses)
