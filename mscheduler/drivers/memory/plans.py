"""The memory driver's plans: a dict by plan id and a heap of due times (the Mongo index's twin).

Heap entries are ``(due_time, seq, plan_id, version)`` and are invalidated lazily: an entry whose
version is no longer the plan's (it was written since) is dropped when met. As in the rest of
``MemoryDriver``, no operation awaits inside, so each is atomic on the event loop.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from mscheduler.domain.plans import PLANNER_STATES
from mscheduler.drivers.base import (
    AdvancePlansParams,
    DuePlansParams,
    InsertPlanParams,
    PlanListParams,
    RunOutcome,
    UpdatePlanParams,
)


class MemoryPlans:
    """Plan operations of ``MemoryDriver`` (a mixin: it uses the driver's ``_tasks``)."""

    _tasks: dict[str, dict[str, Any]]
    _plans: dict[str, dict[str, Any]]
    _plan_due: list[tuple[datetime, int, str, int]]

    def _init_plans(self) -> None:
        self._plans = {}
        self._plan_due = []
        self._plan_seq = itertools.count()

    def _index_plan(self, doc: Mapping[str, Any]) -> None:
        if doc["state"] in PLANNER_STATES and doc.get("due_time") is not None:
            item = (doc["due_time"], next(self._plan_seq), doc["plan_id"], doc["version"])
            heapq.heappush(self._plan_due, item)

    def _live(self, plan_id: str, version: int) -> dict[str, Any] | None:
        doc = self._plans.get(plan_id)
        if doc is None or doc["version"] != version or doc["state"] not in PLANNER_STATES:
            return None
        return doc

    async def insert_plan(self, params: InsertPlanParams) -> bool:
        plan_id = params.plan["plan_id"]
        if plan_id in self._plans:
            return False
        doc = copy.deepcopy(dict(params.plan))
        self._plans[plan_id] = doc
        self._index_plan(doc)
        return True

    async def get_plan(self, plan_id: str) -> dict[str, Any] | None:
        doc = self._plans.get(plan_id)
        return copy.deepcopy(doc) if doc is not None else None

    async def list_plans(self, params: PlanListParams) -> list[dict[str, Any]]:
        docs = [d for d in self._plans.values() if params.state is None or d["state"] == params.state]
        docs.sort(key=lambda d: (d["create_time"], d["plan_id"]))
        return [copy.deepcopy(d) for d in docs[params.skip : params.skip + params.limit]]

    def _set(self, doc: dict[str, Any], fields: Mapping[str, Any], now: datetime) -> None:
        doc.update(copy.deepcopy(dict(fields)))
        doc["update_time"] = now
        self._index_plan(doc)

    async def update_plan(self, params: UpdatePlanParams) -> bool:
        doc = self._plans.get(params.plan_id)
        if doc is None or doc["version"] != params.version:
            return False
        self._set(doc, params.fields, params.now)
        return True

    async def delete_plan(self, plan_id: str) -> bool:
        return self._plans.pop(plan_id, None) is not None

    async def find_due_plans(self, params: DuePlansParams) -> list[dict[str, Any]]:
        heap = self._plan_due
        while heap and self._live(heap[0][2], heap[0][3]) is None:
            heapq.heappop(heap)  # stale: the plan changed, ended, or left the planner's states
        # Best-first walk of the heap's tree: the earliest live entries without popping them.
        found: list[dict[str, Any]] = []
        seen: set[str] = set()
        frontier = [(heap[0], 0)] if heap else []
        while frontier and len(found) < params.limit:
            (due, _, plan_id, version), i = heapq.heappop(frontier)
            if due > params.now:
                break
            doc = self._live(plan_id, version)
            if doc is not None and doc["due_time"] == due and plan_id not in seen:
                seen.add(plan_id)
                found.append(copy.deepcopy(doc))
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return found

    async def advance_plans(self, params: AdvancePlansParams) -> int:
        applied = 0
        for item in params.advances:
            doc = self._plans.get(item.plan_id)
            if doc is None or doc["version"] != item.version or doc["next_fire_time"] != item.next_fire_time:
                continue
            self._set(doc, item.fields, params.now)
            applied += 1
        return applied

    async def get_run_outcomes(self, keys: Sequence[str]) -> dict[str, RunOutcome]:
        outcomes: dict[str, RunOutcome] = {}
        for key in keys:
            doc = self._tasks.get(key)
            if doc is None:
                continue
            ends = [e["end_time"] for e in doc["state"]["worker_states"] if e.get("end_time") is not None]
            outcomes[key] = RunOutcome(
                key, doc["state"]["status"], max(ends) if ends else None, doc.get("plan_id")
            )
        return outcomes
