"""The memory driver's task listings (a mixin of ``MemoryDriver``): sorted lists standing in for
the Mongo listing indexes, kept by every insert, write and removal, and ``list_tasks`` walking
the one that gives the listing's order.

Each listing starts where its range (or its cursor) starts, by bisection, and stops at the end
of the range or once the page is full, as a bounded index range does on MongoDB: a deep page
costs what the first does, never a sort of every task. The lists:

* ``_by_created`` (create_time, key) and ``_by_key`` (key): every task;
* ``_by_finished`` (finish_time, key): the tasks with a finish time, moved when a write sets or
  clears it (finish, expiry, cancel, a child's parent, restart, reset) and on removal;
* ``_by_group[group]`` (create_time, key): the tasks aimed at that group, moved when an option
  change or a reset changes ``option.specific_groups``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

from mscheduler.domain.listing import BY_CREATED, BY_FINISHED, BY_KEY, ORDER_FIELDS, ListParams, prefix_end
from mscheduler.drivers.memory.copying import copy_doc
from mscheduler.drivers.memory.sortedlist import SortedChunks

_Entry = tuple[datetime, str]


def _time_range(
    index: SortedChunks,
    start: datetime | None,
    end: datetime | None,
    after: _Entry | None,
    descending: bool = False,
) -> Iterator[str]:
    """The keys of ``index`` with ``start <= time < end`` and past ``after`` (after it going up,
    before it going down), in the direction asked."""
    if not descending:
        if after is not None and (start is None or after[0] >= start):
            walk = index.ascending(after, strict=True)
        else:
            walk = index.ascending(None if start is None else (start,))
        for when, key in walk:
            if end is not None and when >= end:
                return
            yield key
        return
    high: tuple[Any, ...] | None = None if end is None else (end,)
    if after is not None and (high is None or after < high):
        high = after
    for when, key in index.descending(high):
        if start is not None and when < start:
            return
        yield key


def _key_range(
    index: SortedChunks, prefix: str | None, after: str | None, descending: bool = False
) -> Iterator[str]:
    """The keys of ``index`` starting with ``prefix`` (None: every key) past ``after``, in the
    direction asked."""
    end = None if prefix is None else prefix_end(prefix)
    if not descending:
        if after is not None and (prefix is None or after >= prefix):
            walk = index.ascending(after, strict=True)
        else:
            walk = index.ascending(prefix)
        for key in walk:
            if end is not None and key >= end:
                return
            yield key
        return
    high = end
    if after is not None and (high is None or after < high):
        high = after
    for key in index.descending(high):
        if prefix is not None and key < prefix:
            return
        yield key


class MemoryListing:
    """Listing indexes and ``list_tasks`` (uses ``_tasks``)."""

    _tasks: dict[str, dict[str, Any]]

    def _init_listing(self) -> None:
        self._by_created = SortedChunks()  # (create_time, key)
        self._by_key = SortedChunks()  # key
        self._by_finished = SortedChunks()  # (finish_time, key)
        self._by_group: dict[str, SortedChunks] = {}  # (create_time, key) per group
        self._groups_of: dict[str, tuple[str, ...]] = {}  # key -> the groups it is listed under

    def _list_new(self, doc: dict[str, Any]) -> None:
        """A task was inserted (before its first ``_write``, which lists its groups)."""
        self._by_created.add((doc["state"]["create_time"], doc["key"]))
        self._by_key.add(doc["key"])

    def _relist(self, doc: dict[str, Any], previous_finish: datetime | None) -> None:
        """After a write: move the task in the finished and group lists if it changed there.
        Most writes change neither (a live task aimed at no group): two lookups."""
        key = doc["key"]
        finish = doc["state"]["finish_time"]
        if finish != previous_finish:
            if previous_finish is not None:
                self._by_finished.discard((previous_finish, key))
            if finish is not None:
                self._by_finished.add((finish, key))
        groups = doc["option"].get("specific_groups")
        if groups or key in self._groups_of:
            self._regroup(doc, tuple(groups or ()))

    def _regroup(self, doc: dict[str, Any], groups: tuple[str, ...]) -> None:
        key = doc["key"]
        listed = self._groups_of.get(key, ())
        if groups == listed:
            return
        entry = (doc["state"]["create_time"], key)
        for group in set(listed) - set(groups):
            index = self._by_group[group]
            index.discard(entry)
            if not index:
                del self._by_group[group]
        for group in set(groups) - set(listed):
            self._by_group.setdefault(group, SortedChunks()).add(entry)
        if groups:
            self._groups_of[key] = groups
        else:
            del self._groups_of[key]

    def _unlist(self, doc: dict[str, Any]) -> None:
        """A task was deleted: it leaves every listing."""
        self._by_created.discard((doc["state"]["create_time"], doc["key"]))
        self._by_key.discard(doc["key"])
        finish = doc["state"].get("finish_time")
        if finish is not None:
            self._by_finished.discard((finish, doc["key"]))
        if doc["key"] in self._groups_of:
            self._regroup(doc, ())

    async def list_tasks(self, params: ListParams) -> list[dict[str, Any]]:
        wanted = _matcher(params)
        want = params.limit
        if params.order in _WALKED:
            found: list[dict[str, Any]] = []
            for key in self._walk(params):
                doc = self._tasks[key]
                if wanted(doc):
                    found.append(doc)
                    if len(found) == want:
                        break
        else:
            # updated, status, name, attempts: no list is kept in these orders (they change with
            # most writes); the page is the least (or greatest) ``want`` of a pass over the tasks
            sort_key = _sort_key(params.order)
            pick = heapq.nlargest if params.descending else heapq.nsmallest
            candidates = (self._tasks[k] for k in self._candidates(params))
            found = pick(want, (d for d in candidates if wanted(d)), key=sort_key)
        return [copy_doc(d) for d in found]

    async def count_tasks(self, params: ListParams, cap: int) -> int:
        unpaged = replace(params, after_key=None, after_time=None, after_rank=None)
        wanted = _matcher(unpaged)
        counted = 0
        keys = self._walk(unpaged) if unpaged.order in _WALKED else self._candidates(unpaged)
        for key in keys:
            if wanted(self._tasks[key]):
                counted += 1
                if counted >= cap:
                    break
        return counted

    def _walk(self, params: ListParams) -> Iterator[str]:
        """The candidate keys in the listing's order, from the start of its range or cursor (the
        index MongoDB would read: key, finished, group or created)."""
        down = params.descending
        if params.order == BY_KEY:
            return _key_range(self._by_key, params.key_prefix, params.after_key, down)
        after = None
        if params.after_time is not None and params.after_key is not None:
            after = (params.after_time, params.after_key)
        if params.order == BY_FINISHED:
            return _time_range(self._by_finished, params.finished_from, params.finished_to, after, down)
        index = self._by_created if params.group is None else self._by_group.get(params.group, _EMPTY)
        return _time_range(index, params.created_from, params.created_to, after, down)

    def _candidates(self, params: ListParams) -> Iterator[str]:
        """Every task the filters may select, in no order (a group's own list when given)."""
        if params.group is not None:
            return (key for _, key in self._by_group.get(params.group, _EMPTY))
        return iter(list(self._tasks))


_WALKED = frozenset({BY_CREATED, BY_FINISHED, BY_KEY})
_EMPTY = SortedChunks()  # the list of a group no task is aimed at (never added to)


def _value(doc: dict[str, Any], path: str) -> Any:
    if path.startswith("state."):
        return doc["state"].get(path[6:])
    return doc[path]


def _sort_key(order: str) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A document's sort values in ``order`` (``ORDER_FIELDS``: rank, time, key)."""
    fields = ORDER_FIELDS[order]
    paths = (*fields.rank, *((fields.time,) if fields.time is not None else ()), "key")

    def sort_key(doc: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(_value(doc, path) for path in paths)

    return sort_key


def _matcher(params: ListParams) -> Callable[[dict[str, Any]], bool]:
    """Every filter of ``params`` (and the cursor) as one predicate on a document."""
    order = params.order
    after = params.after
    sort_key = _sort_key(order)
    finished_order = order == BY_FINISHED

    def past(doc: dict[str, Any]) -> bool:
        assert after is not None
        return sort_key(doc) < after if params.descending else sort_key(doc) > after

    def within(value: datetime | None, start: datetime | None, end: datetime | None) -> bool:
        if start is None and end is None:
            return True
        return value is not None and (start is None or value >= start) and (end is None or value < end)

    def wanted(doc: dict[str, Any]) -> bool:
        state = doc["state"]
        return (
            (params.status is None or state["status"] == params.status)
            and (params.name is None or doc["name"] == params.name)
            and (params.key_prefix is None or doc["key"].startswith(params.key_prefix))
            and (
                params.worker_id is None
                or any(e["worker_id"] == params.worker_id for e in state["worker_states"])
            )
            and (params.group is None or params.group in (doc["option"].get("specific_groups") or ()))
            and within(state["create_time"], params.created_from, params.created_to)
            and within(state.get("finish_time"), params.finished_from, params.finished_to)
            and (not finished_order or state.get("finish_time") is not None)
            and (after is None or past(doc))
        )

    return wanted
