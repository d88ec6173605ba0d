"""The rule of a family of tasks (a parent and its children, ``mscheduler.services.children``) that both
drivers apply in a sync: pure, with no storage and no driver imports."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mscheduler.domain.model import TaskStatus, item_key

log = logging.getLogger("mscheduler.children")

SEQUENTIAL = "sequential"
PARALLEL = "parallel"
GRAPH = "graph"  # a workflow: each step once the steps it needs have succeeded
MAP = "map"  # a map step once fanned out: a parent of its items
SYNC_TRIES = 5  # compare-and-set tries of one parent's summary against concurrent syncs
_SUCCEEDED = TaskStatus.SUCCEEDED.value
_ENDED_BADLY = (TaskStatus.FAILED.value, TaskStatus.EXPIRED.value, TaskStatus.CANCELLED.value)
CONTINUE = "continue"  # a map step's on_failure: succeed with what succeeded


@dataclass(slots=True, frozen=True)
class MapExpansion:
    """A map step whose source has succeeded and that is not fanned out yet: ``key`` is the map
    step's, ``source`` the key of the step whose result (a list) it maps over."""

    key: str
    source: str
    max_items: int
    parent: str  # the workflow's key


@dataclass(slots=True, frozen=True)
class SyncPlan:
    """What a sync writes for one parent: its summary, the children to unblock, and the map
    steps to fan out (``mscheduler.publishing.sync_families`` does that, then syncs again)."""

    summary: list[dict[str, Any]]
    unblock: list[str]
    expand: list[MapExpansion] = field(default_factory=list)


def plan_sync(parent: Mapping[str, Any], children: Mapping[str, Mapping[str, Any]]) -> SyncPlan:
    """The one rule of a sync (both drivers call it): the summary lists each child's status in
    order (a child not inserted yet counts as pending: a resend of the family inserts it); in
    sequential mode the first child that has not succeeded is unblocked if it is blocked."""
    definition = parent["children"]
    if definition["mode"] == MAP:
        raise ValueError("a map step's summary comes from its items' statuses (map_summary)")
    summary = []
    for name, key in zip(definition["names"], definition["keys"], strict=True):
        doc = children.get(key)
        status = doc["state"]["status"] if doc is not None else TaskStatus.PENDING.value
        summary.append({"name": name, "key": key, "status": status})
    unblock = []
    # a cancelled parent starts no more children (the running ones finish or are cancelled)
    if definition["mode"] == SEQUENTIAL and parent["state"].get("cancelled") is None:
        for entry in summary:
            if entry["status"] == _SUCCEEDED:
                continue
            doc = children.get(entry["key"])
            if doc is not None and doc["state"].get("blocked") is True:
                unblock.append(entry["key"])
            break
    if definition["mode"] == GRAPH and parent["state"].get("cancelled") is None:
        return _graph_plan(parent["key"], definition, summary, children)
    return SyncPlan(summary, unblock)


def _graph_plan(
    parent_key: str,
    definition: Mapping[str, Any],
    summary: list[dict[str, Any]],
    children: Mapping[str, Mapping[str, Any]],
) -> SyncPlan:
    """A workflow's sync: a blocked step whose needs have all succeeded is unblocked, or, for a
    map step not fanned out yet, fanned out."""
    status = {entry["name"]: entry["status"] for entry in summary}
    unblock: list[str] = []
    expand: list[MapExpansion] = []
    maps = definition.get("maps") or [None] * len(summary)
    for entry, needs, map_of in zip(summary, definition["needs"], maps, strict=True):
        doc = children.get(entry["key"])
        if doc is None or doc["state"].get("blocked") is not True:
            continue
        if not all(status.get(name) == _SUCCEEDED for name in needs):
            continue
        if map_of is None:
            unblock.append(entry["key"])
        elif not doc.get("children"):
            source = definition["keys"][definition["names"].index(map_of["over"])]
            expand.append(MapExpansion(entry["key"], source, int(map_of["max_items"]), parent_key))
    return SyncPlan(summary, unblock, expand)


def map_summary(statuses: Iterable[str], on_failure: str) -> list[dict[str, Any]]:
    """A fanned-out map step's summary: one entry per status among its items (the parent's
    status rule, ``family_status``, needs no more), sorted. With ``on_failure="continue"`` an
    item that ended without success counts as done: the step succeeds once no item is live."""
    seen = set(statuses)
    if on_failure == CONTINUE:
        seen = {_SUCCEEDED if s in _ENDED_BADLY else s for s in seen}
    return [{"status": s} for s in sorted(seen)]


def plan_or_skip(parent: Mapping[str, Any], children: Mapping[str, Mapping[str, Any]]) -> SyncPlan | None:
    """``plan_sync``, or None (logged) for a parent whose stored definition cannot be read (edited
    by hand): one bad document must not stop every consumer's reconciler."""
    try:
        return plan_sync(parent, children)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.error("task %s: its children cannot be read (%r); not synced", parent.get("key"), exc)
        return None


def child_keys_of(parent: Mapping[str, Any]) -> list[str]:
    """The keys of a parent's children as stored ([] when its definition cannot be read; a map
    step's items are not listed: they are found by their ``parent``)."""
    definition = parent.get("children")
    keys = definition.get("keys") if isinstance(definition, Mapping) else None
    return [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []


def result_of(doc: Mapping[str, Any]) -> Any:
    """A succeeded task's result, as ``wait`` returns it and a workflow step that needs it reads
    it: every worker's with ``concurrent_worker_cnt`` > 1, else the one (None for a task set
    succeeded by hand)."""
    results = [w.get("result") for w in doc["state"]["worker_states"] if w["status"] == _SUCCEEDED]
    if doc["option"]["concurrent_worker_cnt"] > 1:
        return results
    return results[0] if results else None


def final_steps(definition: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A workflow's final steps (no step needs them), as (name, key) in their order: ``wait``
    returns their result (one final step: its result; several: ``{name: result}``)."""
    needed = {name for _, _, needs, _ in step_graph(definition) for name in needs}
    return [
        (name, key)
        for name, key in zip(definition["names"], definition["keys"], strict=True)
        if name not in needed
    ]


def step_graph(definition: Mapping[str, Any]) -> list[tuple[str, str, list[str], str | None]]:
    """Every child of a family as a graph node: (name, key, what it needs, the step it maps
    over); sequential children each need the one before, parallel ones nothing."""
    names, keys = definition["names"], definition["keys"]
    mode = definition["mode"]
    if mode == GRAPH:
        maps = definition.get("maps") or [None] * len(names)
        return [
            (n, k, list(needs), (m or {}).get("over"))
            for n, k, needs, m in zip(names, keys, definition["needs"], maps, strict=True)
        ]
    if mode == SEQUENTIAL:
        return [
            (n, k, [names[i - 1]] if i else [], None)
            for i, (n, k) in enumerate(zip(names, keys, strict=True))
        ]
    return [(n, k, [], None) for n, k in zip(names, keys, strict=True)]


def dependents(graph: list[tuple[str, str, list[str], str | None]], name: str) -> list[str]:
    """The steps that depend on ``name``, directly or not, in the graph's order."""
    found = {name}
    changed = True
    while changed:
        changed = False
        for step, _, needs, _ in graph:
            if step not in found and found & set(needs):
                found.add(step)
                changed = True
    return [step for step, _, _, _ in graph if step in found and step != name]


def map_items(doc: Mapping[str, Any]) -> list[str]:
    """The keys of a fanned-out map step's items ([] for any other task)."""
    definition = doc.get("children")
    if not isinstance(definition, Mapping) or definition.get("mode") != MAP:
        return []
    return [item_key(doc["key"], i) for i in range(int(definition.get("count", 0)))]
