"""Statistics of ``MongoDriver`` (SPEC F27) as aggregation pipelines; definitions in
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

Percentiles: MongoDB 7's ``$percentile`` is approximate and mongomock lacks it, so durations are
sorted per name and the nearest ranks picked with ``$arrayElemAt``: exact, the same on every
server, and bounded by the succeeded attempts of the window (``allowDiskUse`` for the sort).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

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
from mscheduler.drivers.base import StatsParams
from mscheduler.drivers.mongo.common import (
    ALL_STATUSES,
    FINISHED_INDEX,
    STATS_COUNTS_INDEX,
    WS,
    T,
    _in,
    _lit,
    _out,
    _resolve,
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
            {"$lte": [claim_at, _lit(params.now)]},
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


def finished_pipeline(params: StatsParams) -> list[dict[str, Any]]:
    """The finished tasks' part: one pass over the tasks finished since the earlier of the
    window's and the throughput hour's starts."""
    assert params.window is not None
    low, high = finished_range(params.now, params.window)
    window_start = _out(params.now - params.window)
    first_bucket = _out(hour_start(params.now))
    match: dict[str, Any] = {"state.finish_time": {"$gte": _out(low), "$lte": _out(high)}}
    if params.names is not None:
        match["name"] = {"$in": list(params.names)}
    match["state.status"] = {"$in": list(FINISHED_STATUSES)}  # one index range per status

    succeeded_entries = {
        "$filter": {"input": f"${WS}", "as": "e", "cond": {"$eq": ["$$e.status", "succeeded"]}}
    }
    succeeded = {"$eq": ["$status", "succeeded"]}
    others = {"$subtract": ["$entries", {"$size": "$ok"}]}

    def count_if(cond: dict[str, Any]) -> dict[str, Any]:
        return {"$sum": {"$cond": [cond, 1, 0]}}

    in_window = {"$match": {"finish": {"$gte": window_start}}}

    def rank(p: int) -> dict[str, Any]:  # stats.rank_index: ceil(p * n / 100) - 1
        return {"$subtract": [{"$ceil": {"$divide": [{"$multiply": ["$n", p]}, 100]}}, 1]}

    picks = {f"p{p}": {"$arrayElemAt": ["$d", rank(p)]} for p in PERCENTILES}
    minute = {"$floor": {"$divide": [{"$subtract": ["$finish", {"$literal": first_bucket}]}, 60_000]}}
    return [
        {"$match": match},
        {
            "$project": {
                "_id": 0,
                "name": 1,
                "status": "$state.status",
                "finish": "$state.finish_time",
                "entries": {"$size": f"${WS}"},
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
                "durations": [
                    in_window,
                    {"$unwind": "$ok"},
                    {"$sort": {"name": 1, "ok": 1}},
                    {"$group": {"_id": "$name", "d": {"$push": "$ok"}, "n": {"$sum": 1}}},
                    {"$project": {"n": 1, **picks}},
                ],
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
            cursor = await _resolve(self.tasks.aggregate(pipeline, hint=index, allowDiskUse=True))
            return [_in(doc) async for doc in cursor]

        return await self._call(what, read)

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
            rows = await self._aggregate("finished tasks", finished_pipeline(params), FINISHED_INDEX)
            facets = rows[0] if rows else {}
            for row in facets.get("window", []):
                raw.finished[row["_id"]] = [row["finished"], row["succeeded"], row["first"], row["second"]]
            for row in facets.get("durations", []):
                raw.durations[row["_id"]] = (row["n"], {p: int(row[f"p{p}"]) for p in PERCENTILES})
            for row in facets.get("throughput", []):
                raw.throughput[(int(row["_id"]["bucket"]), row["_id"]["status"])] = row["n"]
        statuses = tuple(params.statuses) if params.statuses is not None else None
        return assemble(raw, params.now, params.window, statuses)
