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

import bisect
import copy
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from mscheduler.domain.listing import BY_FINISHED, BY_KEY, ListParams

_Entry = tuple[datetime, str]


def _discard(index: list[Any], entry: Any) -> None:
    """Remove ``entry`` from the sorted ``index`` if it is there."""
    i = bisect.bisect_left(index, entry)
    if i < len(index) and index[i] == entry:
        del index[i]


def _time_range(
    index: list[_Entry], start: datetime | None, end: datetime | None, after: _Entry | None
) -> Iterator[str]:
    """The keys of ``index`` with ``start <= time < end`` and after ``after``, in order."""
    i = 0 if start is None else bisect.bisect_left(index, (start,))
    if after is not None:
        i = max(i, bisect.bisect_right(index, after))
    for j in range(i, len(index)):
        when, key = index[j]
        if end is not None and when >= end:
            return
        yield key


def _key_range(index: list[str], prefix: str, after: str | None) -> Iterator[str]:
    """The keys of ``index`` starting with ``prefix`` and after ``after``, in order."""
    i = bisect.bisect_left(index, prefix)
    if after is not None:
        i = max(i, bisect.bisect_right(index, after))
    for j in range(i, len(index)):
        if not index[j].startswith(prefix):
            return  # past the prefix's range
        yield index[j]


class MemoryListing:
    """Listing indexes and ``list_tasks`` (uses ``_tasks``)."""

    _tasks: dict[str, dict[str, Any]]

    def _init_listing(self) -> None:
        self._by_created: list[_Entry] = []
        self._by_key: list[str] = []
        self._by_finished: list[_Entry] = []
        self._by_group: dict[str, list[_Entry]] = {}
        self._groups_of: dict[str, tuple[str, ...]] = {}  # key -> the groups it is listed under

    def _list_new(self, doc: dict[str, Any]) -> None:
        """A task was inserted (before its first ``_write``, which lists its groups)."""
        bisect.insort(self._by_created, (doc["state"]["create_time"], doc["key"]))
        bisect.insort(self._by_key, doc["key"])

    def _relist(self, doc: dict[str, Any], previous_finish: datetime | None) -> None:
        """After a write: move the task in the finished and group lists if it changed there.
        Most writes change neither (a live task aimed at no group): two lookups."""
        key = doc["key"]
        finish = doc["state"]["finish_time"]
        if finish != previous_finish:
            if previous_finish is not None:
                _discard(self._by_finished, (previous_finish, key))
            if finish is not None:
                bisect.insort(self._by_finished, (finish, key))
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
            _discard(index, entry)
            if not index:
                del self._by_group[group]
        for group in set(groups) - set(listed):
            bisect.insort(self._by_group.setdefault(group, []), entry)
        if groups:
            self._groups_of[key] = groups
        else:
            del self._groups_of[key]

    def _unlist(self, doc: dict[str, Any]) -> None:
        """A task was deleted: it leaves every listing."""
        _discard(self._by_created, (doc["state"]["create_time"], doc["key"]))
        _discard(self._by_key, doc["key"])
        finish = doc["state"].get("finish_time")
        if finish is not None:
            _discard(self._by_finished, (finish, doc["key"]))
        if doc["key"] in self._groups_of:
            self._regroup(doc, ())

    async def list_tasks(self, params: ListParams) -> list[dict[str, Any]]:
        wanted = _matcher(params)
        found: list[dict[str, Any]] = []
        want = params.skip + params.limit
        for key in self._walk(params):
            doc = self._tasks[key]
            if wanted(doc):
                found.append(doc)
                if len(found) == want:
                    break
        return [copy.deepcopy(d) for d in found[params.skip :]]

    def _walk(self, params: ListParams) -> Iterator[str]:
        """The candidate keys in the listing's order, from the start of its range or cursor (the
        index MongoDB would read: key, finished, group or created)."""
        if params.order == BY_KEY:
            assert params.key_prefix is not None
            return _key_range(self._by_key, params.key_prefix, params.after_key)
        after = None
        if params.after_time is not None and params.after_key is not None:
            after = (params.after_time, params.after_key)
        if params.order == BY_FINISHED:
            return _time_range(self._by_finished, params.finished_from, params.finished_to, after)
        index = self._by_created if params.group is None else self._by_group.get(params.group, [])
        return _time_range(index, params.created_from, params.created_to, after)


def _matcher(params: ListParams) -> Callable[[dict[str, Any]], bool]:
    """Every filter of ``params`` (and the cursor) as one predicate on a document."""
    order = params.order
    after: tuple[Any, ...] | None = None
    if params.after_key is not None:
        after = (params.after_key,) if order == BY_KEY else (params.after_time, params.after_key)

    def sort_key(doc: dict[str, Any]) -> tuple[Any, ...]:
        if order == BY_KEY:
            return (doc["key"],)
        state = doc["state"]
        return (state["finish_time"] if order == BY_FINISHED else state["create_time"], doc["key"])

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
            and (after is None or sort_key(doc) > after)
        )

    return wanted
