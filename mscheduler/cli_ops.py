"""Operator commands of ``mscheduler``: ``tasks``, ``plans``, ``workers`` and ``stats``
(``limits``: ``mscheduler.cli_limits``).

Thin on purpose: each command connects (as ``check`` does), calls one ``Operations`` method and
prints what it returned (a Rich table, or JSON with ``--json``). No query and no rule lives here;
every refusal comes from ``Operations`` and is printed as one line.

Exit codes: 0 done; 1 refused or not found (``TransitionRefused``, ``UnknownTask``,
``UnknownPlan``, ``UnknownLimit``, no running worker with that id); 2 bad input or usage (``InvalidInput``, a
malformed URI, a bad option); 3 storage unreachable or failing (``StorageError``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, TypeVar, get_args, get_type_hints

import typer
from rich.table import Table
from rich.text import Text
from typer.models import ArgumentInfo

from mscheduler.cli import (
    URI_TIMEOUT_HINT,
    CliError,
    TimeoutMs,
    _database,
    _fail,
    _one_line,
    app,
    ensure_reachable,
    err,
    mongo_client,
    out,
    redact,
)
from mscheduler.cli_stats import stats_renderables, stats_with_progress
from mscheduler.domain.exceptions import (
    InvalidInput,
    MSchedulerError,
    StorageError,
    TransitionRefused,
    UnknownLimit,
    UnknownPlan,
    UnknownTask,
)
from mscheduler.domain.model import TaskInfo
from mscheduler.domain.plans import PlanInfo
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.operations import Operations

EXIT_REFUSED, EXIT_USAGE, EXIT_STORAGE = 1, 2, 3
T = TypeVar("T")

# A hidden testing hook: when set, commands use the Operations it returns instead of connecting
# (tests set it with monkeypatch; it is not part of the command line).
operations_override: Callable[[], Operations] | None = None


def _typer(name: str, help: str) -> typer.Typer:
    return typer.Typer(
        name=name,
        help=help,
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )


EXITS = "Exits 1 if refused or not found, 2 on bad input, 3 if MongoDB fails."
tasks_app = _typer("tasks", f"List, show and steer tasks. {EXITS}")
plans_app = _typer("plans", f"List, show and steer recurring plans. {EXITS}")
workers_app = _typer("workers", f"List registered workers; ask one to stop. {EXITS}")


# -- connecting -----------------------------------------------------------------------------------

UriOpt = Annotated[
    str,
    typer.Option(
        "--mongodb-uri",
        envvar="MSCHEDULER_MONGODB_URI",
        metavar="URI",
        help="The scheduler's MongoDB server.",
    ),
]
DatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database",
        envvar="MSCHEDULER_DATABASE",
        metavar="NAME",
        help="Database (default: the URI's, else mscheduler).",
    ),
]
PrefixOpt = Annotated[
    str, typer.Option("--prefix", metavar="PREFIX", help="Collection prefix (MongoDriver(prefix=...)).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@dataclass(slots=True, frozen=True)
class Connection:
    uri: str
    database: str | None = None
    prefix: str = ""
    server_selection_timeout_ms: int | None = None


@asynccontextmanager
async def connect(conn: Connection) -> AsyncIterator[Operations]:
    """``Operations`` on the server, failing fast (exit 3) when it cannot be reached."""
    if operations_override is not None:
        yield operations_override()
        return
    client = mongo_client(conn.uri, conn.server_selection_timeout_ms)
    try:
        try:
            await ensure_reachable(client, redact(conn.uri), hint=URI_TIMEOUT_HINT)
        except CliError as exc:
            raise CliError(str(exc), exit_code=EXIT_STORAGE) from exc
        db = _database(client, conn.database, "mscheduler")
        yield Operations(MongoDriver(db, prefix=conn.prefix))
    finally:
        await client.close()


def refusal(exc: MSchedulerError) -> CliError:
    """The one-line error and exit code of a refusal from ``Operations``."""
    message = _one_line(str(exc), limit=300)
    if isinstance(exc, InvalidInput):
        return CliError(message, exit_code=EXIT_USAGE)
    if isinstance(exc, StorageError):
        return CliError(f"storage error: {message}", exit_code=EXIT_STORAGE)
    if isinstance(exc, (UnknownTask, UnknownPlan, UnknownLimit, TransitionRefused)):
        return CliError(message, exit_code=EXIT_REFUSED)
    return CliError(message, exit_code=EXIT_REFUSED)


def run(conn: Connection, body: Callable[[Operations], Awaitable[T]]) -> T:
    """Connect, call ``body`` with the operations, and turn every refusal into one line."""

    async def go() -> T:
        async with connect(conn) as ops:
            return await body(ops)

    try:
        return asyncio.run(go())
    except CliError as exc:
        raise _fail(exc) from None
    except MSchedulerError as exc:
        raise _fail(refusal(exc)) from None


_KW = inspect.Parameter.KEYWORD_ONLY
_URI_PARAM = inspect.Parameter("mongodb_uri", _KW, annotation=UriOpt)
_CONNECTION_PARAMS = (
    inspect.Parameter("database", _KW, default=None, annotation=DatabaseOpt),
    inspect.Parameter("prefix", _KW, default="", annotation=PrefixOpt),
    inspect.Parameter("server_selection_timeout_ms", _KW, default=None, annotation=TimeoutMs),
)


def connected(command: Callable[..., None]) -> Callable[..., None]:
    """A command taking ``conn: Connection`` gets the connection options — ``--mongodb-uri``
    (or ``MSCHEDULER_MONGODB_URI``) after its arguments, ``--database``, ``--prefix`` and
    ``--server-selection-timeout-ms`` last — declared once, here, for every operator command.

    Typer reads a command's parameters from its signature: the wrapper shows the command's own
    (``conn`` left out) with the four options added, and builds the ``Connection`` from them."""
    hints = get_type_hints(command, include_extras=True)
    own = [
        p.replace(kind=_KW, annotation=hints.get(p.name, p.annotation))
        for p in inspect.signature(command).parameters.values()
        if p.name != "conn"
    ]
    arguments = [
        p for p in own if get_args(p.annotation) and isinstance(get_args(p.annotation)[-1], ArgumentInfo)
    ]
    options = [p for p in own if p not in arguments]
    params = [*arguments, _URI_PARAM, *options, *_CONNECTION_PARAMS]

    @functools.wraps(command)
    def wrapper(
        *,
        mongodb_uri: str,
        database: str | None = None,
        prefix: str = "",
        server_selection_timeout_ms: int | None = None,
        **kwargs: Any,
    ) -> None:
        command(conn=Connection(mongodb_uri, database, prefix, server_selection_timeout_ms), **kwargs)

    wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return wrapper


# -- printing -------------------------------------------------------------------------------------


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def print_json(value: Any) -> None:
    out.print_json(json.dumps(value, default=str))


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
        cells = [t.key, t.name, t.status.value, str(t.attempts), "yes" if t.paused else ""]
        if finished:
            cells.append(_when(t.finish_time))
        cells += [_when(t.update_time), f"{error.type}: {error.message}" if error else ""]
        table.add_row(*cells)
    return table


def task_detail(t: TaskInfo) -> list[Table]:
    head = Table(title=f"task {t.key}", show_header=False)
    head.add_column("field")
    head.add_column("value")
    for field, value in (
        ("name", t.name),
        ("status", t.status.value + (" (paused)" if t.paused else "")),
        ("created", _when(t.create_time)),
        ("updated", _when(t.update_time)),
        ("next due", _when(t.next_due)),
        ("attempts", f"{t.attempts} (succeeded {t.success_cnt}, failed {t.fail_cnt})"),
        ("running", str(t.running_cnt)),
        ("cancelled", (t.cancelled or {}).get("reason", "") if t.cancelled else ""),
    ):
        head.add_row(field, value)
    timeline = Table(title="attempts")
    for column in ("#", "worker", "status", "start", "end", "error"):
        timeline.add_column(column)
    for n, w in enumerate(t.worker_states, 1):
        error = f"{w.error.type}: {w.error.message}" if w.error else ""
        timeline.add_row(str(n), w.worker_id, w.status.value, _when(w.start_time), _when(w.end_time), error)
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
            _when(p.next_fire_time),
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
        ("next fire", _when(p.next_fire_time)),
        ("runs made", str(p.runs_made)),
        ("skipped", str(p.skipped_cnt)),
        ("skip next", str(p.skip_next)),
        ("last run", p.last_run_key or ""),
        ("last run status", p.last_run_status or ""),
        ("failures in a row", str(p.consecutive_failures)),
        ("created", _when(p.create_time)),
        ("updated", _when(p.update_time)),
    ):
        table.add_row(field, value)
    return table


def _done(message: str) -> None:
    out.print(Text(message))


# -- tasks ----------------------------------------------------------------------------------------

KeyArg = Annotated[str, typer.Argument(metavar="KEY", hidden=True)]
ForceOpt = Annotated[bool, typer.Option("--force", help="Allow it on a task the rule protects.")]


def _instant(value: str | None, option: str) -> datetime | None:
    """An ISO-8601 time with its offset (``2030-01-01T00:00:00Z``) from a command-line option."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        message = f"{option}: an ISO-8601 time with its offset, e.g. 2030-01-01T00:00:00Z"
        raise _fail(CliError(message, exit_code=EXIT_USAGE))
    return parsed


@tasks_app.command("ls", short_help="List tasks, oldest first.")
@connected
def tasks_ls(
    conn: Connection,
    status: Annotated[str | None, typer.Option(metavar="STATUS", help="Only this status.")] = None,
    name: Annotated[str | None, typer.Option(metavar="NAME", help="Only this task name.")] = None,
    key_prefix: Annotated[
        str | None, typer.Option(metavar="PREFIX", help="Only keys starting so (listed in key order).")
    ] = None,
    worker: Annotated[
        str | None, typer.Option(metavar="WORKER_ID", help="Only tasks with an attempt of this worker.")
    ] = None,
    created_from: Annotated[
        str | None, typer.Option(metavar="TIME", help="Created at or after (ISO-8601 with offset).")
    ] = None,
    created_to: Annotated[
        str | None, typer.Option(metavar="TIME", help="Created before (ISO-8601 with offset).")
    ] = None,
    finished_from: Annotated[
        str | None,
        typer.Option(metavar="TIME", help="Finished at or after (ISO-8601 with offset; by finish time)."),
    ] = None,
    finished_to: Annotated[
        str | None,
        typer.Option(metavar="TIME", help="Finished before (ISO-8601 with offset; by finish time)."),
    ] = None,
    group: Annotated[
        str | None, typer.Option(metavar="GROUP", help="Only tasks aimed at this worker group.")
    ] = None,
    cursor: Annotated[
        str | None, typer.Option(metavar="CURSOR", help="Go on from a previous page (same filters).")
    ] = None,
    limit: Annotated[int, typer.Option(metavar="N", help="At most N tasks (1-1000).")] = 50,
    skip: Annotated[
        int, typer.Option(metavar="N", help="Skip the first N tasks (deprecated: use --cursor).")
    ] = 0,
    as_json: JsonOpt = False,
) -> None:
    """List tasks oldest first (with --key-prefix: in key order; with --finished-from / --to and
    no prefix: by finish time, finished tasks only), filtered by status, name, key prefix,
    worker, group, creation and finish time. When more tasks follow, the next page's --cursor
    is printed after the table (with --json: on stderr, stdout stays a JSON list)."""
    since, until = _instant(created_from, "--created-from"), _instant(created_to, "--created-to")
    done_since = _instant(finished_from, "--finished-from")
    done_until = _instant(finished_to, "--finished-to")
    page = run(
        conn,
        lambda ops: ops.page_tasks(
            status=status,
            name=name,
            key_prefix=key_prefix,
            worker_id=worker,
            created_from=since,
            created_to=until,
            finished_from=done_since,
            finished_to=done_until,
            group=group,
            cursor=cursor,
            limit=limit,
            skip=skip,
        ),
    )
    if as_json:
        print_json([t.model_dump(mode="json") for t in page.tasks])
        if page.next_cursor is not None:
            err.print(f"next_cursor: {page.next_cursor}")
    else:
        out.print(task_rows(page.tasks, finished=done_since is not None or done_until is not None))
        if page.next_cursor is not None:
            out.print(Text(f"more: --cursor {page.next_cursor}"))


@tasks_app.command("show", short_help="Show a task and its attempts.")
@connected
def tasks_show(
    conn: Connection,
    key: KeyArg,
    as_json: JsonOpt = False,
) -> None:
    """Show task KEY: status, counters, attempts (worker, status, start, end, error),
    checkpoint, progress, children and its last events (where the store records events)."""

    async def show(ops: Operations) -> tuple[TaskInfo, list[Any]]:
        info = await ops.get_task(key)
        return info, await cli_tasks.last_events(ops, key)

    info, events = run(conn, show)
    if as_json:
        print_json(info.model_dump(mode="json") | {"events": [e.model_dump(mode="json") for e in events]})
    else:
        for table in [*task_detail(info), *cli_tasks.task_extras(info, events)]:
            out.print(table)


@tasks_app.command("cancel", short_help="Cancel a pending or running task.")
@connected
def tasks_cancel(
    conn: Connection,
    key: KeyArg,
    reason: Annotated[str, typer.Option(metavar="TEXT", help="Why (kept on the task).")] = "",
) -> None:
    """Cancel task KEY if pending or running (a running handler stops at its next ping)."""
    info = run(conn, lambda ops: ops.cancel(key, reason))
    _done(f"cancelled task {info.key!r} (now {info.status.value})")


@tasks_app.command("pause", short_help="Stop claims of a task until resumed.")
@connected
def tasks_pause(
    conn: Connection,
    key: KeyArg,
    stop_running: Annotated[
        bool,
        typer.Option(
            "--stop-running",
            help="Also stop its running attempts (released, not counted against its retries).",
        ),
    ] = False,
) -> None:
    """Stop claims of task KEY (pending or running) until it is resumed; with --stop-running its
    running handlers are stopped too and the resumed task starts from its last checkpoint."""
    info = run(conn, lambda ops: ops.pause(key, stop_running=stop_running))
    _done(f"paused task {info.key!r} ({info.status.value})")


@tasks_app.command("resume", short_help="Make a paused task claimable again.")
@connected
def tasks_resume(
    conn: Connection,
    key: KeyArg,
) -> None:
    """Make the paused task KEY claimable again."""
    info = run(conn, lambda ops: ops.resume(key))
    _done(f"resumed task {info.key!r} ({info.status.value})")


@tasks_app.command("set-status", short_help="Set a task's (or a child's) status by hand.")
@connected
def tasks_set_status(
    conn: Connection,
    key: KeyArg,
    status: Annotated[str, typer.Argument(metavar="STATUS", hidden=True)],
    child: Annotated[
        str | None, typer.Option(metavar="NAME", help="The child of task KEY with this name.")
    ] = None,
    reason: Annotated[str, typer.Option(metavar="TEXT", help="Why (kept on the task).")] = "",
) -> None:
    """Set task KEY's status by hand: succeeded (a step done by hand; not running, not succeeded
    yet) or failed (pending, nothing running). With --child NAME: that child of KEY, which may
    also be set cancelled or pending (run again); its parent follows (the next sequential step
    starts). A parent's own status comes from its children: set theirs."""
    if child is None:
        info = run(conn, lambda ops: ops.set_status(key, status, reason=reason, by="cli"))
    else:
        info = run(conn, lambda ops: ops.set_child_status(key, child, status, reason=reason, by="cli"))
    _done(f"task {info.key!r} is now {info.status.value}")


@tasks_app.command("restart", short_help="Run failed, cancelled or expired tasks again.")
@connected
def tasks_restart(
    conn: Connection,
    keys: Annotated[list[str] | None, typer.Argument(metavar="KEY...", hidden=True)] = None,
    status: Annotated[
        str | None, typer.Option(metavar="STATUS", help="Every task of this status (no KEYs).")
    ] = None,
    name: Annotated[str | None, typer.Option(metavar="NAME", help="With --status: of this name.")] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run tasks KEY... again if failed, cancelled or expired (succeeded: with --force), or
    every task of --status (and --name). Many tasks: a progress bar on stderr, a line per task
    not restarted, exit 1 if any was not."""
    if bool(keys) == (status is not None) or (name is not None and status is None):
        message = "give KEY... or --status STATUS [--name NAME], not both"
        raise _fail(CliError(message, exit_code=EXIT_USAGE))
    if keys and len(keys) == 1 and not as_json:
        info = run(conn, lambda ops: ops.restart(keys[0], force=force))
        _done(f"restarted task {info.key!r} (now {info.status.value})")
        return
    show_progress = not as_json and err.is_terminal

    async def restart(ops: Operations) -> list[Any]:
        chosen = list(keys or ()) or await cli_tasks.select_keys(ops, str(status), name)
        return await cli_tasks.restart_keys(ops, chosen, force, show_progress)

    if not cli_tasks.print_restarts(run(conn, restart), as_json):
        raise typer.Exit(EXIT_REFUSED)


@tasks_app.command("remove", short_help="Delete a task that is not running.")
@connected
def tasks_remove(
    conn: Connection,
    key: KeyArg,
    force: ForceOpt = False,
) -> None:
    """Delete task KEY unless running (a running one with --force: cancelled first)."""
    run(conn, lambda ops: ops.remove(key, force=force))
    _done(f"removed task {key!r}")


# -- plans ----------------------------------------------------------------------------------------

PlanArg = Annotated[str, typer.Argument(metavar="ID", hidden=True)]


@plans_app.command("ls", short_help="List plans, oldest first.")
@connected
def plans_ls(
    conn: Connection,
    state: Annotated[str | None, typer.Option(metavar="STATE", help="Only this plan state.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List plans oldest first, optionally of one state."""
    plans = run(conn, lambda ops: ops.list_plans(state=state))
    if as_json:
        print_json([p.model_dump(mode="json") for p in plans])
    else:
        out.print(plan_rows(plans))


@plans_app.command("show", short_help="Show a plan.")
@connected
def plans_show(
    conn: Connection,
    plan_id: PlanArg,
    as_json: JsonOpt = False,
) -> None:
    """Show plan ID: state, next fire time, counters and its last run."""
    info = run(conn, lambda ops: ops.get_plan(plan_id))
    if as_json:
        print_json(info.model_dump(mode="json"))
    else:
        out.print(plan_detail(info))


@plans_app.command("suspend", short_help="Suspend a plan.")
@connected
def plans_suspend(
    conn: Connection,
    plan_id: PlanArg,
) -> None:
    """Suspend plan ID: no occurrence is made until it is resumed."""
    info = run(conn, lambda ops: ops.suspend_plan(plan_id))
    _done(f"suspended plan {info.plan_id!r} ({info.state.value})")


@plans_app.command("resume", short_help="Resume a suspended or failing plan.")
@connected
def plans_resume(
    conn: Connection,
    plan_id: PlanArg,
) -> None:
    """Resume plan ID if suspended or parked in the error state."""
    info = run(conn, lambda ops: ops.resume_plan(plan_id))
    _done(f"resumed plan {info.plan_id!r} ({info.state.value})")


@plans_app.command("skip", short_help="Skip a plan's next N occurrences.")
@connected
def plans_skip(
    conn: Connection,
    plan_id: PlanArg,
    n: Annotated[int, typer.Argument(metavar="N", hidden=True)] = 1,
) -> None:
    """Skip the next N occurrences of plan ID (default 1; sets the count: 0 cancels skips)."""
    info = run(conn, lambda ops: ops.skip_plan(plan_id, n))
    _done(f"plan {info.plan_id!r} skips its next {info.skip_next} occurrence(s)")


@plans_app.command("remove", short_help="Delete a plan (its tasks stay).")
@connected
def plans_remove(
    conn: Connection,
    plan_id: PlanArg,
) -> None:
    """Delete plan ID; the tasks it already made stay."""
    run(conn, lambda ops: ops.remove_plan(plan_id))
    _done(f"removed plan {plan_id!r}")


# -- workers --------------------------------------------------------------------------------------


@workers_app.command("ls", short_help="List registered workers.")
@connected
def workers_ls(
    conn: Connection,
    as_json: JsonOpt = False,
) -> None:
    """List registered workers, oldest first, with whether each is live."""
    workers = run(conn, lambda ops: ops.list_workers())
    if as_json:
        print_json([asdict(w) for w in workers])
        return
    table = Table(title=f"workers ({len(workers)})")
    columns = ("worker id", "host", "pid", "names", "groups", "slots", "running", "live", "stop", "last seen")
    for column in columns:
        table.add_column(column)
    for w in workers:
        table.add_row(
            w.worker_id,
            w.host,
            str(w.pid),
            ", ".join(w.names),
            ", ".join(w.groups),
            str(w.concurrency),
            str(w.running_cnt),
            "yes" if w.live else "no",
            "requested" if w.stop_requested else "",
            _when(w.last_seen),
        )
    out.print(table)


@workers_app.command("stop", short_help="Ask a running worker to stop gracefully.")
@connected
def workers_stop(
    conn: Connection,
    worker_id: Annotated[str, typer.Argument(metavar="WORKER_ID", hidden=True)],
) -> None:
    """Ask the running worker WORKER_ID to stop gracefully (at its next heartbeat)."""
    if not run(conn, lambda ops: ops.request_worker_stop(worker_id)):
        raise _fail(CliError(f"no running worker with id {worker_id!r}", exit_code=EXIT_REFUSED))
    _done(f"asked worker {worker_id!r} to stop")


# -- stats ----------------------------------------------------------------------------------------


@connected
def stats(
    conn: Connection,
    as_json: JsonOpt = False,
    window: Annotated[
        int, typer.Option(metavar="MINUTES", help="Window of rates and durations (1-10080).")
    ] = 60,
    name: Annotated[list[str] | None, typer.Option(metavar="NAME", help="Only this task name.")] = None,
) -> None:
    """Task statistics: counts by status and name, first- and second-attempt success rates,
    duration p50 / p95, the oldest due pending task, throughput over the last hour. While the
    store computes them, a line on stderr (a terminal only) names the phase and the time spent."""
    show = not as_json and err.is_terminal
    result = run(
        conn, lambda ops: stats_with_progress(ops, timedelta(minutes=window), name or None, err, show)
    )
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    for shown in stats_renderables(result):
        out.print(shown)


app.add_typer(tasks_app)
app.add_typer(plans_app)
app.add_typer(workers_app)
app.command(short_help="Task statistics: counts, success rates, durations.")(stats)

# `mscheduler web` (mscheduler.cli_web) and send, edit, plans add, events and the helpers of show
# and restart (mscheduler.cli_tasks) share these options; imported last for that reason
from mscheduler import cli_limits, cli_maintenance, cli_tasks, cli_web  # noqa: E402, F401
