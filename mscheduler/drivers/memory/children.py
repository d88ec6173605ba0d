"""The memory driver's child-task operations (``mscheduler.services.children``): syncs, the reconciler's
read of unfinished parents, statuses set by hand, and the workflow steps' results, fan-outs and
resets. As in the rest of ``MemoryDriver``, no operation awaits inside, so each is atomic on the
event loop (the compare-and-sets the Mongo driver needs always hold here)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mscheduler.domain.family import (
    MAP,
    MapExpansion,
    child_keys_of,
    map_items,
    map_summary,
    plan_or_skip,
    result_of,
)
from mscheduler.drivers.base import (
    ExpandMapParams,
    MarkParams,
    OpenParentsParams,
    ResetStepsParams,
    StepResult,
    SyncOutcome,
    SyncParentsParams,
)
from mscheduler.drivers.memory.copying import copy_doc
from mscheduler.drivers.memory.sortedlist import SortedChunks

_OPEN = ("pending", "running")
_SUCCEEDED = "succeeded"


class MemoryChildren:
    """Child-task operations of ``MemoryDriver`` (a mixin: it uses ``_tasks`` and ``_write``)."""

    _tasks: dict[str, dict[str, Any]]
    _parents: SortedChunks
    _version: dict[str, int]

    if TYPE_CHECKING:

        def _write(self, doc: dict[str, Any], now: datetime) -> None: ...

        def _forget(self, doc: dict[str, Any]) -> None: ...

    def _init_children(self) -> None:
        # keys of the unfinished parents, in key order (the Mongo driver's partial index): kept
        # by every write of a parent, so the reconciler reads a page, never every parent
        self._parents = SortedChunks()
        # per parent, how many of its children are in each status (the Mongo driver's ``family``
        # index: a map step's statuses without reading its items), and each child's counted status
        self._family_counts: dict[str, Counter[str]] = {}
        self._counted: dict[str, str] = {}

    def _index_parent(self, doc: dict[str, Any]) -> None:
        """After a write of a parent: in the open-parents index while it is unfinished."""
        key = doc["key"]
        listed = key in self._parents
        if doc["state"]["status"] in _OPEN:
            if not listed:
                self._parents.add(key)
        elif listed:
            self._parents.discard(key)

    def _count_child(self, doc: dict[str, Any]) -> None:
        """After a write of a child: move it to its status in its parent's counts."""
        key, status = doc["key"], doc["state"]["status"]
        before = self._counted.get(key)
        if before == status:
            return
        counts = self._family_counts.get(doc["parent"])
        if counts is None:
            counts = self._family_counts[doc["parent"]] = Counter()
        if before is not None:
            counts[before] -= 1
            if counts[before] <= 0:
                del counts[before]
        counts[status] += 1
        self._counted[key] = status

    def _uncount_child(self, doc: dict[str, Any]) -> None:
        """A child was deleted: it leaves its parent's counts."""
        before = self._counted.pop(doc["key"], None)
        counts = self._family_counts.get(doc["parent"])
        if before is not None and counts is not None:
            counts[before] -= 1
            if counts[before] <= 0:
                del counts[before]
            if not counts:
                del self._family_counts[doc["parent"]]

    async def sync_parents(self, params: SyncParentsParams) -> SyncOutcome:
        changed = 0
        expand: list[MapExpansion] = []
        cascade: list[str] = []
        for key in dict.fromkeys(params.keys):
            parent = self._tasks.get(key)
            if parent is None or "children" not in parent:
                continue
            state = parent["state"]
            try:
                is_map = parent["children"]["mode"] == MAP
            except (KeyError, TypeError):
                is_map = False
            if is_map:
                statuses = self._family_counts.get(key, Counter())
                summary = map_summary(statuses, parent["children"].get("on_failure", "fail"))
            else:
                children = {k: self._tasks[k] for k in child_keys_of(parent) if k in self._tasks}
                plan = plan_or_skip(parent, children)
                if plan is None:
                    continue
                for child in plan.unblock:
                    children[child]["state"]["blocked"] = False
                    self._write(children[child], params.now)
                expand += plan.expand
                summary = plan.summary
            if summary != state["children"]:
                state["children"] = summary
                state["children_rev"] = state.get("children_rev", 0) + 1
                self._write(parent, params.now)
                changed += 1
                if parent.get("parent") is not None:
                    cascade.append(parent["parent"])
        return SyncOutcome(changed, expand, cascade)

    async def find_open_parents(self, params: OpenParentsParams) -> list[str]:
        keys: list[str] = []
        for key in self._parents.ascending(params.after, strict=True):
            doc = self._tasks.get(key)
            if doc is not None and doc["state"]["status"] in _OPEN and (not keys or keys[-1] != key):
                keys.append(key)
                if len(keys) == params.limit:
                    break
        return keys

    async def mark_task(self, params: MarkParams) -> bool:
        doc = self._tasks.get(params.key)
        if doc is None or "children" in doc:
            return False
        if doc["state"]["status"] not in params.statuses or doc["state"]["running_cnt"]:
            return False
        doc["state"]["marked"] = {
            "status": params.status,
            "reason": params.reason,
            "by": params.by,
            "time": params.now,
        }
        self._write(doc, params.now)
        return True

    # -- workflows ----------------------------------------------------------------------------

    async def read_results(self, keys: Sequence[str]) -> dict[str, StepResult]:
        out: dict[str, StepResult] = {}
        for key in dict.fromkeys(keys):
            doc = self._tasks.get(key)
            if doc is None:
                continue
            definition = doc.get("children")
            if isinstance(definition, dict) and definition.get("mode") == MAP:
                items = (self._tasks.get(one) for one in map_items(doc))
                results = [result_of(item) for item in items if item is not None and _succeeded(item)]
                out[key] = StepResult(doc["state"]["status"], copy_doc({"v": results})["v"])
            else:
                out[key] = StepResult(doc["state"]["status"], copy_doc({"v": result_of(doc)})["v"])
        return out

    async def expand_map(self, params: ExpandMapParams) -> bool:
        doc = self._tasks.get(params.key)
        if doc is None or "children" in doc or doc["state"].get("blocked") is not True:
            return False
        on_failure = params.on_failure
        doc["children"] = {"mode": MAP, "count": params.count, "on_failure": on_failure}
        state = doc["state"]
        state["blocked"] = False
        state["children"] = map_summary(self._family_counts.get(params.key, Counter()), on_failure)
        state["children_rev"] = 0
        self._write(doc, params.now)  # lists it among the open parents
        return True

    async def count_items(self, key: str) -> dict[str, int]:
        return {status: n for status, n in self._family_counts.get(key, Counter()).items() if n > 0}

    async def reset_steps(self, params: ResetStepsParams) -> int:
        reset = 0
        for key in dict.fromkeys(params.keys):
            doc = self._tasks.get(key)
            if doc is None or doc["state"]["running_cnt"]:
                continue
            items = map_items(doc)
            definition = doc.pop("children", None)
            if definition is not None:
                for one in items:
                    item = self._tasks.pop(one, None)
                    if item is not None:
                        self._forget(item)
                        del self._version[item["key"]]  # a removed key keeps no version
                for field in ("children", "children_rev"):
                    doc["state"].pop(field, None)
                self._parents.discard(key)
            doc["state"]["blocked"] = True
            self._write(doc, params.now)
            reset += 1
        return reset


def _succeeded(doc: dict[str, Any]) -> bool:
    return bool(doc["state"]["status"] == _SUCCEEDED)
