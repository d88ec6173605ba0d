"""Statistics of ``MemoryDriver``: the numbers of ``mongo_stats.py``'s pipelines,
computed in Python in one pass over the tasks (definitions in ``mscheduler.domain.stats``).

Stored times have millisecond precision (every clock cuts to it, as BSON does) and the bounds
are cut the same way, so datetimes compare directly and both drivers give identical answers.
A task outside the window costs a dictionary update and a comparison. The pass hands the event
loop back every ``STATS_CHUNK`` tasks (a dashboard's or a scrape's read of a large store never
stalls the consumers on the same loop); like an aggregation on MongoDB, it is not a snapshot.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from mscheduler.domain.clock import truncate_ms
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
    attempt_class,
    finished_range,
    hour_start,
    rank_index,
)
from mscheduler.drivers.base import KeyWaitParams, StatsParams

_MS = timedelta(milliseconds=1)
_MINUTE = timedelta(minutes=1)
STATS_CHUNK = 5000  # tasks counted between two yields to the event loop


class MemoryStats:
    """``task_stats`` of ``MemoryDriver`` (a mixin: it uses the driver's ``_tasks``)."""

    _tasks: dict[str, dict[str, Any]]

    async def key_waits(self, params: KeyWaitParams) -> list[KeyWait]:
        """The Mongo driver's aggregation over the ``lanes`` index, in one pass over the tasks."""
        now = truncate_ms(params.now)
        names = set(params.names) if params.names is not None else None
        found: dict[str, tuple[int, datetime]] = {}
        for i, doc in enumerate(list(self._tasks.values())):
            if i and not i % STATS_CHUNK:
                await asyncio.sleep(0)
            key, claim_at = doc["option"].get("fair_key"), doc["state"]["claim_at"]
            if key is None or claim_at is None or claim_at > now:
                continue
            if names is not None and doc["name"] not in names:
                continue
            due, oldest = found.get(key, (0, claim_at))
            found[key] = (due + 1, min(oldest, claim_at))
        ranked = sorted(found.items(), key=lambda item: (item[1][1], item[0]))[: params.limit]
        return [KeyWait(key=k, due=due, oldest_wait=(now - at) / _MS / 1000) for k, (due, at) in ranked]

    async def task_stats(self, params: StatsParams, on_step: StatsStep | None = None) -> TaskStats:
        # one pass over every task does both parts: one step, named after the first
        if on_step is not None:
            on_step(COUNT_STEP if params.window is None else f"{COUNT_STEP}; {WINDOW_STEP}")
        raw = RawStats()
        now = truncate_ms(params.now)
        names = set(params.names) if params.names is not None else None
        statuses = set(params.statuses) if params.statuses is not None else None
        counts, oldest = raw.counts, raw.oldest_due
        window = params.window
        low = high = window_start = first_bucket = now
        if window is not None:
            low, high = (truncate_ms(t) for t in finished_range(params.now, window))
            window_start, first_bucket = truncate_ms(params.now - window), hour_start(params.now)
        durations: dict[str, list[int]] = {}
        docs = list(self._tasks.values())
        for i, doc in enumerate(docs):
            if i and not i % STATS_CHUNK:
                await asyncio.sleep(0)
            name = doc["name"]
            if names is not None and name not in names:
                continue
            state = doc["state"]
            status = state["status"]
            if statuses is None or status in statuses:
                counts[(name, status)] = counts.get((name, status), 0) + 1
                if status == "pending":
                    claim_at = state.get("claim_at")
                    if claim_at is not None and claim_at <= now:
                        earliest = oldest.get(name)
                        if earliest is None or claim_at < earliest:
                            oldest[name] = claim_at
            if window is None or status not in FINISHED_STATUSES:
                continue
            finish: datetime | None = state.get("finish_time")
            if finish is None or finish < low or finish > high:
                continue
            if finish >= first_bucket:
                bucket = ((finish - first_bucket) // _MINUTE, status)
                raw.throughput[bucket] = raw.throughput.get(bucket, 0) + 1
            if finish < window_start:
                continue
            _count_finished(raw, name, status, state["worker_states"], durations)
        for name, values in durations.items():
            values.sort()
            raw.durations[name] = (len(values), {p: values[rank_index(len(values), p)] for p in PERCENTILES})
        asked = tuple(params.statuses) if params.statuses is not None else None
        return assemble(raw, params.now, window, asked)


def _count_finished(
    raw: RawStats, name: str, status: str, entries: list[dict[str, Any]], durations: dict[str, list[int]]
) -> None:
    counted = raw.finished.setdefault(name, [0, 0, 0, 0])
    counted[0] += 1
    if status == "succeeded":
        counted[1] += 1
        kind = attempt_class(entries)
        if kind is not None:
            counted[kind + 1] += 1
    for entry in entries:
        if entry["status"] == "succeeded":
            durations.setdefault(name, []).append((entry["end_time"] - entry["start_time"]) // _MS)
