"""How the operator commands print what ``Operations`` returned: task and plan rows and details,
events, a task's last events (Rich tables with stored text shown as text).
"""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from mscheduler.cli.common import Ops, event_log, one_line, shown_time
from mscheduler.domain.model import TaskInfo
from mscheduler.domain.plans import PlanInfo
from mscheduler.services.events import LIST_LIMIT_MAX, Event


def task_rows(tasks: list[TaskInfo], *, finished: bool = False) -> Table:
    """The task list's table; ``finished``: with the finish time (the order of a finished range)."""
    table = Table(title=f"tasks ({len(tasks)})")
    columns = ["key", "name", "status", "attempts", "paused", "updated", "last error"]
    if finished:
        columns.insert(5, "finished")
    for column in columns:
        table.add_column(column)
    for t in tasks:
        error = t.last_error
        cells = [t.key, t.name, t.status.value, str(len(t.worker_states)), "yes" if t.paused else ""]
        if finished:
            cells.append(shown_time(t.finish_time))
        cells += [shown_time(t.update_time), f"{error.type}: {error.message}" if error else ""]
        table.add_row(*cells)
    return table


def attempt_counts(t: TaskInfo) -> str:
    """How many attempts the table below lists, by status, and how many of them count against
    the retry budget (released, revoked, snoozed and cancelled ones do not)."""
    by_status: dict[str, int] = {}
    for entry in t.worker_states:
        by_status[entry.status.value] = by_status.get(entry.status.value, 0) + 1
    shown = ", ".join(f"{n} {status}" for status, n in by_status.items())
    budget = "" if t.max_attempts is None else f" of at most {t.max_attempts}"
    counted = f"{t.attempts}{budget} counted against its retries"
    return f"{len(t.worker_states)}" + (f" ({shown}; {counted})" if shown else f" ({counted})")


def one_line_json(value: Any, limit: int = 200) -> str:
    return one_line(json.dumps(value, default=str), limit=limit)


def task_detail(t: TaskInfo) -> list[Table]:
    head = Table(title=f"task {t.key}", show_header=False)
    head.add_column("field")
    head.add_column("value")
    rows = [
        ("name", t.name),
        ("status", t.status.value + (" (paused)" if t.paused else "")),
        ("created", shown_time(t.create_time)),
        ("updated", shown_time(t.update_time)),
        ("next due", shown_time(t.next_due)),
        ("attempts", attempt_counts(t)),
        ("running", str(t.running_cnt)),
    ]
    if t.progress is not None:
        text = f"{t.progress.fraction:.0%}" + (f" {t.progress.message}" if t.progress.message else "")
        rows.append(("progress", f"{text} (at {shown_time(t.progress.time)})"))
    if t.results:  # every worker's with concurrent_worker_cnt > 1 (as publisher.wait returns)
        rows.append(
            ("result", one_line_json(t.results if t.option.concurrent_worker_cnt > 1 else t.results[0]))
        )
    if t.cancelled:
        rows.append(("cancelled", str(t.cancelled.get("reason") or "")))
    for field, value in rows:
        head.add_row(field, value)
    timeline = Table(title="attempts")
    for column in ("#", "worker", "status", "start", "end", "error"):
        timeline.add_column(column)
    for n, w in enumerate(t.worker_states, 1):
        error = f"{w.error.type}: {w.error.message}" if w.error else ""
        timeline.add_row(
            str(n), w.worker_id, w.status.value, shown_time(w.start_time), shown_time(w.end_time), error
        )
    return [head, timeline]


def plan_rows(plans: list[PlanInfo]) -> Table:
    table = Table(title=f"plans ({len(plans)})")
    for column in ("plan id", "name", "state", "next fire", "runs", "last run"):
        table.add_column(column)
    for p in plans:
        table.add_row(
            p.plan_id,
            p.name,
            p.state.value,
            shown_time(p.next_fire_time),
            str(p.runs_made),
            p.last_run_status or "",
        )
    return table


def plan_detail(p: PlanInfo) -> Table:
    table = Table(title=f"plan {p.plan_id}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    for field, value in (
        ("name", p.name),
        ("state", p.state.value),
        ("next fire", shown_time(p.next_fire_time)),
        ("runs made", str(p.runs_made)),
        ("skipped", str(p.skipped_cnt)),
        ("skip next", str(p.skip_next)),
        ("last run", p.last_run_key or ""),
        ("last run status", p.last_run_status or ""),
        ("failures in a row", str(p.consecutive_failures)),
        ("created", shown_time(p.create_time)),
        ("updated", shown_time(p.update_time)),
    ):
        table.add_row(field, value)
    return table


def event_rows(found: list[Event], title: str) -> Table:
    table = Table(title=title)
    for column in ("time", "kind", "key", "name", "worker", "#", "detail"):
        table.add_column(column)
    for e in found:
        detail = ", ".join(f"{k}={v}" for k, v in e.detail.items() if v not in (None, "", {}))
        table.add_row(
            shown_time(e.time),
            e.kind.value,
            e.key,
            e.name,
            e.worker_id or "",
            "" if e.attempt is None else str(e.attempt),
            one_line(detail, limit=120),
        )
    return table


def event_line(e: Event) -> str:
    who = f" {e.worker_id}#{e.attempt}" if e.worker_id else ""
    detail = ", ".join(f"{k}={v}" for k, v in e.detail.items() if v not in (None, "", {}))
    return one_line(f"{e.time.isoformat()} {e.kind.value:<10} {e.key} ({e.name}){who} {detail}".rstrip())


LAST_EVENTS = 10


async def last_events(ops: Ops, key: str) -> list[Event]:
    """The task's newest events (empty when the store records none)."""
    found = await event_log(ops).list(keys=key, limit=LIST_LIMIT_MAX)
    return found[-LAST_EVENTS:]


def task_extras(info: Any, events: list[Event]) -> list[Table]:
    """``tasks show`` beyond the attempts: checkpoint, parent, children, the last events."""
    shown: list[Table] = []
    rows = []
    if info.checkpoint is not None:
        data = one_line_json(info.checkpoint.data)
        rows.append(
            ("checkpoint", f"{data} (at {shown_time(info.checkpoint.time)}, {info.checkpoint.worker_id})")
        )
    if info.parent is not None:
        rows.append(("parent", info.parent))
    if rows:
        table = Table(title="state", show_header=False)
        table.add_column("field")
        table.add_column("value")
        for row in rows:
            table.add_row(*row)
        shown.append(table)
    if info.children:
        children = Table(title=f"children ({info.children_mode or 'sequential'})")
        for column in ("name", "key", "status"):
            children.add_column(column)
        for child in info.children:
            children.add_row(child.name, child.key, child.status.value)
        shown.append(children)
    if events:
        shown.append(event_rows(events, f"last events ({len(events)})"))
    return shown
