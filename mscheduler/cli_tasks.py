"""More operator commands: ``tasks send``, ``tasks edit``, ``plans add``, ``events ls`` and
``events tail`` (registered on the groups of ``mscheduler.cli_ops``, same options and exit codes).

Thin like the others: input is parsed into the domain's own models (``Task``, ``OptionChange``,
``Plan``) whose validation is the only rule; a refusal is one line (exit 2 for bad input, nothing
written). ``tasks send`` goes through a ``Publisher``, the rest through ``Operations`` and
``Events``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from mscheduler.cli import CliError, _fail, _one_line, app, err, out
from mscheduler.cli_ops import (
    EXIT_USAGE,
    Connection,
    JsonOpt,
    KeyArg,
    _done,
    _instant,
    _typer,
    _when,
    connected,
    plan_detail,
    plans_app,
    print_json,
    run,
    tasks_app,
)
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import OptionChange, Task, TaskOption
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import PlanTiming
from mscheduler.operations import Operations
from mscheduler.runtime.publisher import Publisher
from mscheduler.services.events import LIST_LIMIT_MAX, Event, Events

events_app = _typer(
    "events",
    "List and follow recorded task events. Writers record them with MongoDriver(db, "
    "events=True). Exits 2 on bad input, 3 if MongoDB fails.",
)


def usage(message: str) -> typer.Exit:
    return _fail(CliError(_one_line(message, limit=300), exit_code=EXIT_USAGE))


def invalid(exc: ValidationError | InvalidInput, what: str) -> typer.Exit:
    """A model's refusal as one line: the first problem, where and why."""
    if isinstance(exc, InvalidInput):  # the domain's models translate their own errors
        return usage(str(exc))
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return usage(f"{what}: {loc + ': ' if loc else ''}{message}{more}")


def json_value(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise usage(f"{option}: not JSON ({exc})") from None


def _option_fields(
    priority: int | None,
    run_at: str | None,
    deadline: str | None,
    max_retries: int | None,
    retry_delay: float | None,
    workers: list[str] | None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if priority is not None:
        fields["priority"] = priority
    if run_at is not None:
        fields["run_at"] = _instant(run_at, "--run-at")
    if deadline is not None:
        fields["deadline"] = _instant(deadline, "--deadline")
    if max_retries is not None:
        fields["max_unexpected_retries"] = max_retries
    if retry_delay is not None:
        fields["retry_delay"] = timedelta(seconds=retry_delay)
    if workers:
        fields["specific_worker_ids"] = tuple(workers)
    return fields


PriorityOpt = Annotated[int | None, typer.Option(metavar="N", help="Higher is claimed first.")]
RunAtOpt = Annotated[str | None, typer.Option(metavar="TIME", help="Not claimed before (ISO-8601).")]
DeadlineOpt = Annotated[
    str | None, typer.Option(metavar="TIME", help="Expires if not started by (ISO-8601).")
]
RetriesOpt = Annotated[
    int | None, typer.Option("--max-retries", metavar="N", help="Failures before it fails for good.")
]
RetryDelayOpt = Annotated[float | None, typer.Option(metavar="SECONDS", help="Wait after a failure.")]
WorkerOpt = Annotated[
    list[str] | None,
    typer.Option("--specific-worker", metavar="WORKER_ID", help="Only this worker (repeatable)."),
]


# -- tasks send / edit ----------------------------------------------------------------------------


@tasks_app.command("send", short_help="Send a task (idempotent by key).")
@connected
def tasks_send(
    conn: Connection,
    name: Annotated[str, typer.Argument(metavar="NAME", hidden=True)],
    key: Annotated[str, typer.Option(metavar="KEY", help="The task's unique key.")],
    params: Annotated[str | None, typer.Option(metavar="JSON", help="The params, as JSON.")] = None,
    priority: PriorityOpt = None,
    run_at: RunAtOpt = None,
    deadline: DeadlineOpt = None,
    max_retries: RetriesOpt = None,
    retry_delay: RetryDelayOpt = None,
    specific_worker: WorkerOpt = None,
    unique_by_params: Annotated[
        bool, typer.Option("--unique-by-params", help="No second live task with these params.")
    ] = False,
    reset_finished: Annotated[
        bool, typer.Option("--reset-finished", help="Reset a finished task with this key.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Send task NAME with --key and --params (JSON). A key that exists is left alone (exit 0,
    "exists"); --reset-finished resets a succeeded or failed one."""
    fields = _option_fields(priority, run_at, deadline, max_retries, retry_delay, specific_worker)
    try:
        task = Task(
            key,
            name,
            json_value(params, "--params"),
            option=TaskOption(**fields),
            unique_by="params" if unique_by_params else "key",
        )
    except (ValidationError, InvalidInput) as exc:
        raise invalid(exc, "task") from None

    async def send(ops: Operations) -> bool:
        return await Publisher(ops.driver).send(task, reset_finished=reset_finished)

    created = run(conn, send)
    if as_json:
        print_json({"key": task.key, "created": created})
    else:
        _done(f"sent task {task.key!r} ({name})" if created else f"task {task.key!r} exists (left as it is)")


@tasks_app.command("edit", short_help="Change a pending or running task's options.")
@connected
def tasks_edit(
    conn: Connection,
    key: KeyArg,
    priority: PriorityOpt = None,
    run_at: RunAtOpt = None,
    deadline: DeadlineOpt = None,
    max_retries: RetriesOpt = None,
    retry_delay: RetryDelayOpt = None,
    specific_worker: WorkerOpt = None,
    any_worker: Annotated[bool, typer.Option("--any-worker", help="Let any worker run it.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Change options of task KEY (pending or running); options left out stay."""
    fields = _option_fields(priority, run_at, deadline, max_retries, retry_delay, specific_worker)
    if any_worker:
        if specific_worker:
            raise usage("--any-worker and --specific-worker exclude each other")
        fields["specific_worker_ids"] = ()
    if not fields:
        raise usage("nothing to change: give at least one option (see --help)")
    try:
        change = OptionChange(**fields)
    except (ValidationError, InvalidInput) as exc:
        raise invalid(exc, "option") from None
    option = run(conn, lambda ops: ops.edit(key, change))
    if as_json:
        print_json(option.model_dump(mode="json"))
    else:
        changed = ", ".join(f"{f}={getattr(option, f)}" for f in sorted(change.model_fields_set))
        _done(f"edited task {key!r}: {changed}")


# -- plans add ------------------------------------------------------------------------------------


@plans_app.command("add", short_help="Create a plan (cron, interval or once).")
@connected
def plans_add(
    conn: Connection,
    plan_id: Annotated[str | None, typer.Argument(metavar="ID", hidden=True)] = None,
    name: Annotated[str | None, typer.Argument(metavar="NAME", hidden=True)] = None,
    cron: Annotated[str | None, typer.Option(metavar="EXPR", help="Cron expression.")] = None,
    every: Annotated[float | None, typer.Option(metavar="SECONDS", help="Interval.")] = None,
    at: Annotated[str | None, typer.Option(metavar="TIME", help="Once, at this time.")] = None,
    tz: Annotated[str, typer.Option(metavar="ZONE", help="IANA time zone.")] = "UTC",
    start: Annotated[str | None, typer.Option(metavar="TIME", help="First occurrence / none before.")] = None,
    end: Annotated[str | None, typer.Option(metavar="TIME", help="No occurrence after.")] = None,
    repeat: Annotated[int | None, typer.Option(metavar="N", help="Runs to make (default: forever).")] = None,
    params: Annotated[str | None, typer.Option(metavar="JSON", help="Each run's params.")] = None,
    priority: PriorityOpt = None,
    max_retries: RetriesOpt = None,
    file: Annotated[
        Path | None, typer.Option("--file", metavar="FILE", help="The plan as JSON (a Plan).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create plan ID running task NAME: --cron EXPR, --every SECONDS or --at TIME (one of
    them), or --file FILE with the whole plan as JSON (ID and NAME then come from it)."""
    plan = _plan_from_file(file) if file is not None else None
    if plan is None:
        if plan_id is None or name is None:
            raise usage("give ID and NAME, or --file FILE")
        kinds = [k for k, v in (("--cron", cron), ("--every", every), ("--at", at)) if v is not None]
        if len(kinds) != 1:
            raise usage("give exactly one of --cron EXPR, --every SECONDS, --at TIME")
        first = _instant(start, "--start")
        schedule: dict[str, Any]
        if cron is not None:
            schedule = {"kind": "cron", "expression": cron}
        elif every is not None:
            schedule = {"kind": "every", "interval": every, "start": first or datetime.now(UTC)}
        else:
            schedule = {"kind": "at", "at": _instant(at, "--at")}
        fields = _option_fields(priority, None, None, max_retries, None, None)
        try:
            plan = Plan(
                plan_id=plan_id,
                name=name,
                params=json_value(params, "--params"),
                option=TaskOption(**fields),
                timing=PlanTiming.model_validate(
                    {
                        "schedule": schedule,
                        "tz": tz,
                        "start": first,
                        "end": _instant(end, "--end"),
                        "repeat": repeat,
                    }
                ),
            )
        except (ValidationError, InvalidInput) as exc:
            raise invalid(exc, "plan") from None
    elif any(v is not None for v in (plan_id, name, cron, every, at, start, end, repeat, params)):
        raise usage("--file gives the whole plan: no ID, NAME or timing options with it")
    info = run(conn, lambda ops: ops.add_plan(plan))
    if as_json:
        print_json(info.model_dump(mode="json"))
    else:
        out.print(plan_detail(info))


def _plan_from_file(path: Path) -> Plan:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise usage(f"--file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        return Plan.model_validate_json(text)
    except (ValidationError, InvalidInput) as exc:
        raise invalid(exc, f"plan in {str(path)!r}") from None


# -- events ---------------------------------------------------------------------------------------

EventKeyOpt = Annotated[str | None, typer.Option("--key", metavar="KEY", help="One task's events.")]
EventNameOpt = Annotated[str | None, typer.Option("--name", metavar="NAME", help="Of this task name.")]
KindOpt = Annotated[
    list[str] | None, typer.Option("--kind", metavar="KIND", help="Only this kind (repeatable).")
]
PlanOpt = Annotated[str | None, typer.Option("--plan", metavar="ID", help="Of this plan's runs.")]
SinceOpt = Annotated[str | None, typer.Option(metavar="TIME", help="At or after (ISO-8601).")]


def event_rows(found: list[Event], title: str) -> Table:
    table = Table(title=title)
    for column in ("time", "kind", "key", "name", "worker", "#", "detail"):
        table.add_column(column)
    for e in found:
        detail = ", ".join(f"{k}={v}" for k, v in e.detail.items() if v not in (None, "", {}))
        table.add_row(
            _when(e.time),
            e.kind.value,
            e.key,
            e.name,
            e.worker_id or "",
            "" if e.attempt is None else str(e.attempt),
            _one_line(detail, limit=120),
        )
    return table


def event_line(e: Event) -> str:
    who = f" {e.worker_id}#{e.attempt}" if e.worker_id else ""
    detail = ", ".join(f"{k}={v}" for k, v in e.detail.items() if v not in (None, "", {}))
    return _one_line(f"{e.time.isoformat()} {e.kind.value:<10} {e.key} ({e.name}){who} {detail}".rstrip())


@events_app.command("ls", short_help="List recorded events, oldest first.")
@connected
def events_ls(
    conn: Connection,
    key: EventKeyOpt = None,
    name: EventNameOpt = None,
    kind: KindOpt = None,
    plan: PlanOpt = None,
    worker: Annotated[str | None, typer.Option(metavar="WORKER_ID", help="Of this worker.")] = None,
    since: SinceOpt = None,
    until: Annotated[str | None, typer.Option(metavar="TIME", help="Before (ISO-8601).")] = None,
    limit: Annotated[int, typer.Option(metavar="N", help=f"At most N (1-{LIST_LIMIT_MAX}).")] = 100,
    skip: Annotated[int, typer.Option(metavar="N", help="Skip the first N.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """List events in time order, filtered by task, name, kind, plan, worker and time."""
    first, last = _instant(since, "--since"), _instant(until, "--until")

    async def listing(ops: Operations) -> list[Event]:
        return await Events(ops.driver).list(
            keys=key,
            names=name,
            kinds=kind,
            plans=plan,
            worker_id=worker,
            since=first,
            until=last,
            limit=limit,
            skip=skip,
        )

    found = run(conn, listing)
    if as_json:
        print_json([e.model_dump(mode="json") for e in found])
        return
    out.print(event_rows(found, f"events ({len(found)})"))
    if len(found) == limit:
        out.print(Text(f"more: --skip {skip + limit}"))


@events_app.command("tail", short_help="Follow new events (Ctrl+C stops).")
@connected
def events_tail(
    conn: Connection,
    key: EventKeyOpt = None,
    name: EventNameOpt = None,
    kind: KindOpt = None,
    plan: PlanOpt = None,
    since: SinceOpt = None,
    count: Annotated[int | None, typer.Option(metavar="N", min=1, help="Stop after N events.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print new events as they are stored, one a line (--json: one JSON object a line), from
    now or from --since; until Ctrl+C or --count events."""
    first = _instant(since, "--since")

    async def follow(ops: Operations) -> int:
        seen = 0
        source = Events(ops.driver).subscribe(keys=key, names=name, kinds=kind, plans=plan, since=first)
        try:
            async for event in source:
                if as_json:
                    out.print(json.dumps(event.model_dump(mode="json")), markup=False, highlight=False)
                else:
                    out.print(Text(event_line(event)))
                seen += 1
                if count is not None and seen >= count:
                    break
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()
        return seen

    try:
        run(conn, follow)
    except KeyboardInterrupt:
        err.print("stopped")


# -- tasks restart (many) and tasks show (extras); the commands live in cli_ops -----------------

RESTART_BATCH = 100  # keys per Operations.restart_many call (its own limit is MANY_MAX)


async def select_keys(ops: Operations, status: str, name: str | None) -> list[str]:
    """Every key with this status (and name), read page by page before anything changes (a
    restart moves a task out of the status the pages are read by)."""
    keys: list[str] = []
    cursor: str | None = None
    while True:
        page = await ops.page_tasks(status=status, name=name, cursor=cursor, limit=LIST_LIMIT_MAX)
        keys.extend(t.key for t in page.tasks)
        if page.next_cursor is None:
            return keys
        cursor = page.next_cursor


async def restart_keys(ops: Operations, keys: list[str], force: bool, show_progress: bool) -> list[Any]:
    """``restart_many`` in batches, with a progress bar on stderr when asked."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    outcomes: list[Any] = []
    columns = (TextColumn("restarting"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err, transient=True, disable=not show_progress) as progress:
        bar = progress.add_task("restart", total=len(keys))
        for start in range(0, len(keys), RESTART_BATCH):
            batch = keys[start : start + RESTART_BATCH]
            outcomes.extend((await ops.restart_many(batch, force=force)).values())
            progress.advance(bar, len(batch))
    return outcomes


def print_restarts(outcomes: list[Any], as_json: bool) -> bool:
    """Print what ``restart_many`` did; True if every task was restarted."""
    if as_json:
        print_json(
            [{"key": o.key, "outcome": o.outcome, "status": o.status, "rule": o.rule} for o in outcomes]
        )
    else:
        for o in outcomes:
            if o.outcome == "refused":
                out.print(Text(f"{o.key}: refused (it is {o.status}: {o.rule})"))
            elif o.outcome == "unknown":
                out.print(Text(f"{o.key}: no such task"))
        done = sum(o.restarted for o in outcomes)
        out.print(Text(f"restarted {done} of {len(outcomes)} task(s)"))
    return all(o.restarted for o in outcomes)


LAST_EVENTS = 10


async def last_events(ops: Operations, key: str) -> list[Event]:
    """The task's newest events (empty when the store records none)."""
    found = await Events(ops.driver).list(keys=key, limit=LIST_LIMIT_MAX)
    return found[-LAST_EVENTS:]


def task_extras(info: Any, events: list[Event]) -> list[Table]:
    """``tasks show`` beyond the attempts: checkpoint, progress, children, the last events."""
    shown: list[Table] = []
    rows = []
    if info.checkpoint is not None:
        data = _one_line(json.dumps(info.checkpoint.data, default=str), limit=200)
        rows.append(("checkpoint", f"{data} (at {_when(info.checkpoint.time)}, {info.checkpoint.worker_id})"))
    if info.progress is not None:
        text = f"{info.progress.fraction:.0%}" + (
            f" {info.progress.message}" if info.progress.message else ""
        )
        rows.append(("progress", f"{text} (at {_when(info.progress.time)})"))
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


app.add_typer(events_app)
