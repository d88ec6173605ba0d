"""The memory driver's lifecycle bookkeeping (a mixin of ``MemoryDriver``): ``state.finish_time``
and ``state.unique_live`` after every write, the live params hashes (what MongoDB's unique
partial index ``unique_live`` enforces), and the retention pass over finished tasks, served by a
heap per status ordered by finish time (no scan of the store)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mscheduler.domain.family import map_items
from mscheduler.domain.state import LIVE, lifecycle
from mscheduler.drivers.base import PurgeParams, RetentionParams, UniqueParamsTaken
from mscheduler.drivers.memory.copying import copy_doc
from mscheduler.drivers.memory.sortedlist import SortedChunks


class MemoryMaintenance:
    """Finish times, live params hashes and the retention pass (uses ``_tasks``, ``_version``)."""

    _tasks: dict[str, dict[str, Any]]
    _version: dict[str, int]
    _seq: itertools.count[int]

    _parents: SortedChunks
    compactions: int

    if TYPE_CHECKING:

        def _unlist(self, doc: dict[str, Any]) -> None: ...

        def _uncount_child(self, doc: dict[str, Any]) -> None: ...

        def _heap_bound(self) -> int: ...

    def _init_maintenance(self) -> None:
        self._live_hashes: dict[str, str] = {}  # unique_hash -> key of the live task holding it
        # per terminal status: (finish_time, seq, key); stale entries are skipped when popped
        self._finished: dict[str, list[tuple[datetime, int, str]]] = {}

    def _note_lifecycle(self, doc: dict[str, Any], now: datetime) -> None:
        """Set ``finish_time`` / ``unique_live`` after ``derive`` and keep the indexes right."""
        state = doc["state"]
        previous_finish, previous_live = state.get("finish_time"), state.get("unique_live")
        unique_hash = doc.get("unique_hash")
        if (
            state["status"] in LIVE
            and previous_finish is None
            and previous_live is None
            and unique_hash is None
        ):
            # the common case (a live task without a params hash): nothing to set or index
            state["finish_time"] = state["unique_live"] = None
            return
        state.update(lifecycle(state["status"], previous_finish, unique_hash, now, state.get("children")))
        if previous_live is not None and self._live_hashes.get(previous_live) == doc["key"]:
            del self._live_hashes[previous_live]
        if state["unique_live"] is not None:
            self._live_hashes[state["unique_live"]] = doc["key"]
        if state["finish_time"] is not None and "parent" not in doc:  # children go with their parent
            # pushed again on later writes: the status may change
            heap = self._finished.setdefault(state["status"], [])
            if len(heap) > self._heap_bound():
                heap = self._finished[state["status"]] = self._live_finished(state["status"])
            heapq.heappush(heap, (state["finish_time"], next(self._seq), doc["key"]))

    def _live_finished(self, status: str) -> list[tuple[datetime, int, str]]:
        """The retention heap of ``status`` without stale entries (one per task finished so)."""
        live: dict[str, tuple[datetime, int, str]] = {}
        for item in self._finished.get(status, ()):
            doc = self._tasks.get(item[2])
            if (
                doc is not None
                and doc["state"]["status"] == status
                and doc["state"]["finish_time"] == item[0]
            ):
                live[item[2]] = item
        heap = list(live.values())
        heapq.heapify(heap)
        self.compactions += 1
        return heap

    def _unique_holder(self, unique_hash: str | None, key: str) -> str | None:
        """The key of another live task holding ``unique_hash`` (None: free, or no hash)."""
        if unique_hash is None:
            return None
        holder = self._live_hashes.get(unique_hash)
        return holder if holder is not None and holder != key else None

    def _check_unique(self, doc: dict[str, Any]) -> None:
        """Refuse (``UniqueParamsTaken``) a change that would make ``doc`` live while another
        live task holds its params hash (the unique index's refusal in MongoDB)."""
        holder = self._unique_holder(doc.get("unique_hash"), doc["key"])
        if holder is not None:
            raise UniqueParamsTaken(doc["key"], holder)

    def _forget(self, doc: dict[str, Any]) -> None:
        """A task was deleted: its params hash is free again, and it leaves the listings."""
        self._unlist(doc)
        if "parent" in doc:
            self._uncount_child(doc)
        if "children" in doc:
            self._parents.discard(doc["key"])
        live = doc["state"].get("unique_live")
        if live is not None and self._live_hashes.get(live) == doc["key"]:
            del self._live_hashes[live]

    async def ensure_retention(self, params: RetentionParams) -> bool:
        return False  # no TTL monitor in process: the retention pass is the mechanism

    async def purge_finished(self, params: PurgeParams) -> int:
        heap = self._finished.get(params.status, [])
        removed = 0
        while heap and removed < params.limit and heap[0][0] <= params.before:
            finish_time, _, key = heapq.heappop(heap)
            doc = self._tasks.get(key)
            if doc is None or doc["state"]["status"] != params.status:
                continue  # deleted, restarted or changed since: a new finish has its own entry
            if doc["state"]["finish_time"] != finish_time:
                continue
            # a family goes whole: its children first (all finished: the parent has a finish time)
            children = list(doc.get("children", {}).get("keys", ()))
            # a workflow's map steps' items go first
            items = [i for c in children if (step := self._tasks.get(c)) is not None for i in map_items(step)]
            for child_key in [*items, *children, key]:
                child = self._tasks.pop(child_key, None)
                if child is not None:
                    self._forget(child)
                    del self._version[child_key]  # its heap entries are stale now
            removed += 1
        return removed

    async def get_tasks(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        return [copy_doc(self._tasks[k]) for k in dict.fromkeys(keys) if k in self._tasks]
