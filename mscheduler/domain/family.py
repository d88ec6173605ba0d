"""The rule of a family of tasks (a parent and its children, ``mscheduler.services.children``) that both
drivers apply in a sync: pure, with no storage and no driver imports."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mscheduler.domain.model import TaskStatus

log = logging.getLogger("mscheduler.children")

SEQUENTIAL = "sequential"
PARALLEL = "parallel"
SYNC_TRIES = 5  # compare-and-set tries of one parent's summary against concurrent syncs
_SUCCEEDED = TaskStatus.SUCCEEDED.value


@dataclass(slots=True, frozen=True)
class SyncPlan:
    """What a sync writes for one parent: its summary, and the children to unblock."""

    summary: list[dict[str, Any]]
    unblock: list[str]


def plan_sync(parent: Mapping[str, Any], children: Mapping[str, Mapping[str, Any]]) -> SyncPlan:
    """The one rule of a sync (both drivers call it): the summary lists each child's status in
    order (a child not inserted yet counts as pending: a resend of the family inserts it); in
    sequential mode the first child that has not succeeded is unblocked if it is blocked."""
    definition = parent["children"]
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
    return SyncPlan(summary, unblock)


def plan_or_skip(parent: Mapping[str, Any], children: Mapping[str, Mapping[str, Any]]) -> SyncPlan | None:
    """``plan_sync``, or None (logged) for a parent whose stored definition cannot be read (edited
    by hand): one bad document must not stop every consumer's reconciler."""
    try:
        return plan_sync(parent, children)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.error("task %s: its children cannot be read (%r); not synced", parent.get("key"), exc)
        return None


def child_keys_of(parent: Mapping[str, Any]) -> list[str]:
    """The keys of a parent's children as stored ([] when its definition cannot be read)."""
    definition = parent.get("children")
    keys = definition.get("keys") if isinstance(definition, Mapping) else None
    return [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []
