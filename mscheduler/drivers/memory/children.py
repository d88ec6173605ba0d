"""The memory driver's child-task operations (``mscheduler.services.children``): syncs, the reconciler's
read of unfinished parents, and statuses set by hand. As in the rest of ``MemoryDriver``, no
operation awaits inside, so each is atomic on the event loop (the compare-and-sets the Mongo
driver needs always hold here)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from mscheduler.domain.family import child_keys_of, plan_or_skip
from mscheduler.drivers.base import MarkParams, OpenParentsParams, SyncParentsParams
from mscheduler.drivers.memory.sortedlist import SortedChunks

_OPEN = ("pending", "running")


class MemoryChildren:
    """Child-task operations of ``MemoryDriver`` (a mixin: it uses ``_tasks`` and ``_write``)."""

    _tasks: dict[str, dict[str, Any]]
    _parents: SortedChunks

    if TYPE_CHECKING:

        def _write(self, doc: dict[str, Any], now: datetime) -> None: ...

    def _init_children(self) -> None:
        # keys of the unfinished parents, in key order (the Mongo driver's partial index): kept
        # by every write of a parent, so the reconciler reads a page, never every parent
        self._parents = SortedChunks()

    def _index_parent(self, doc: dict[str, Any]) -> None:
        """After a write of a parent: in the open-parents index while it is unfinished."""
        key = doc["key"]
        listed = key in self._parents
        if doc["state"]["status"] in _OPEN:
            if not listed:
                self._parents.add(key)
        elif listed:
            self._parents.discard(key)

    async def sync_parents(self, params: SyncParentsParams) -> int:
        changed = 0
        for key in dict.fromkeys(params.keys):
            parent = self._tasks.get(key)
            if parent is None or "children" not in parent:
                continue
            children = {k: self._tasks[k] for k in child_keys_of(parent) if k in self._tasks}
            plan = plan_or_skip(parent, children)
            if plan is None:
                continue
            for child in plan.unblock:
                children[child]["state"]["blocked"] = False
                self._write(children[child], params.now)
            state = parent["state"]
            if plan.summary != state["children"]:
                state["children"] = plan.summary
                state["children_rev"] = state.get("children_rev", 0) + 1
                self._write(parent, params.now)
                changed += 1
        return changed

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
