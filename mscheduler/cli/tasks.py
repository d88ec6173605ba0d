"""``mscheduler tasks``: list, show, send, edit, cancel, pause, resume, set a status, restart and
remove tasks.

Thin on purpose: each command connects (as ``check`` does), calls one ``Operations`` method (or a
``Publisher`` for ``send``) and prints what it returned (a Rich table, or JSON with ``--json``).
No query and no rule lives here; every refusal comes from ``Operations`` and is printed as one line
with the exit codes of ``mscheduler.cli.common``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.text import Text

from mscheduler.cli.common import (
    EXIT_REFUSED,
    EXIT_USAGE,
    EXITS,
    CliError,
    Connection,
    DeadlineOpt,
    ForceOpt,
    JsonOpt,
    KeyArg,
    Ops,
    PriorityOpt,
    RetriesOpt,
    RetryDelayOpt,
    RunAtOpt,
    WorkerOpt,
    app,
    command_group,
    connected,
    err,
    exit_with,
    invalid,
    json_value,
    option_fields,
    out,
    parse_instant,
    print_json,
    read_text,
    run,
    say_done,
    usage,
)
from mscheduler.cli.render import last_events, task_detail, task_extras, task_rows
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import OptionChange, Task, TaskInfo, TaskOption
from mscheduler.services.events import LIST_LIMIT_MAX

# -- tasks ----------------------------------------------------------------------------------------


tasks_app = command_group("tasks", f"List, show and steer tasks. {EXITS}")


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
    sort: Annotated[
        str | None,
        typer.Option(
            metavar="ORDER",
            help="created, updated, finished, status, name, attempts or key; '-' in front: "
            "descending (--sort=-created: newest first).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List tasks oldest first (with --key-prefix: in key order; with --finished-from / --to and
    no prefix: by finish time, finished tasks only) or as --sort says, filtered by status,
    name, key prefix, worker, group, creation and finish time. When more tasks follow, the next
    page's --cursor is printed after the table (with --json: on stderr, stdout stays a JSON
    list)."""
    since, until = parse_instant(created_from, "--created-from"), parse_instant(created_to, "--created-to")
    done_since = parse_instant(finished_from, "--finished-from")
    done_until = parse_instant(finished_to, "--finished-to")
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
            sort=sort,
        ),
    )
    if as_json:
        print_json([t.model_dump(mode="json") for t in page.tasks])
        if page.next_cursor is not None:
            err.print(f"next_cursor: {page.next_cursor}")
    else:
        by_finish = done_since is not None or done_until is not None or (sort or "").lstrip("-") == "finished"
        out.print(task_rows(page.tasks, finished=by_finish))
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

    async def show(ops: Ops) -> tuple[TaskInfo, list[Any]]:
        info = await ops.get_task(key)
        return info, await last_events(ops, key)

    info, events = run(conn, show)
    if as_json:
        print_json(info.model_dump(mode="json") | {"events": [e.model_dump(mode="json") for e in events]})
    else:
        for table in [*task_detail(info), *task_extras(info, events)]:
            out.print(table)


@tasks_app.command("graph", short_help="Show a workflow's steps and their statuses.")
@connected
def tasks_graph(
    conn: Connection,
    key: KeyArg,
    as_json: JsonOpt = False,
) -> None:
    """Show the steps of task KEY (a task with children) in order: status, what each needs, the
    step a map step maps over and its items by status; the final steps are marked *."""
    graph = run(conn, lambda ops: ops.workflow(key))
    if as_json:
        print_json(graph.model_dump(mode="json"))
        return
    out.print(Text(f"{graph.key}  {graph.status.value}  ({graph.mode})"))
    for step in graph.steps:
        needs = f" <- {', '.join(step.needs)}" if step.needs else ""
        over = f" maps over {step.map_over}" if step.map_over else ""
        items = ""
        if step.item_statuses is not None:
            counts = ", ".join(f"{n} {s}" for s, n in sorted(step.item_statuses.items()))
            items = f" [{step.items} items: {counts or 'none'}]"
        final = " *" if step.name in graph.final else ""
        out.print(Text(f"  {step.name}{final}  {step.status.value}{needs}{over}{items}"))


@tasks_app.command("restart-step", short_help="Run a workflow's step again, with what depends on it.")
@connected
def tasks_restart_step(
    conn: Connection,
    key: KeyArg,
    step: Annotated[str, typer.Argument(metavar="STEP", help="The step's name.")],
) -> None:
    """Run the finished step STEP of workflow KEY again, and every step that depends on it
    (refused while one of them is pending or running)."""
    graph = run(conn, lambda ops: ops.restart_step(key, step, by="cli"))
    say_done(f"restarted step {step!r} of {graph.key!r} (now {graph.status.value})")


@tasks_app.command("cancel", short_help="Cancel a pending or running task.")
@connected
def tasks_cancel(
    conn: Connection,
    key: KeyArg,
    reason: Annotated[str, typer.Option(metavar="TEXT", help="Why (kept on the task).")] = "",
) -> None:
    """Cancel task KEY if pending or running (a running handler stops at its next ping)."""
    info = run(conn, lambda ops: ops.cancel(key, reason))
    say_done(f"cancelled task {info.key!r} (now {info.status.value})")


@tasks_app.command("pause", short_help="Stop claims of a task until resumed.")
@connected
def tasks_pause(
    conn: Connection,
    key: KeyArg,
    stop_running: Annotated[
        bool,
        typer.Option(
            "--stop-running",
            help="Also stop its running attempts (released once their handlers stopped, not "
            "counted against its retries).",
        ),
    ] = False,
) -> None:
    """Stop claims of task KEY (pending or running) until it is resumed; with --stop-running its
    running handlers are stopped too and the resumed task starts from its last checkpoint."""
    info = run(conn, lambda ops: ops.pause(key, stop_running=stop_running))
    stopping = (
        f"; {info.running_cnt} running attempt(s) told to stop" if stop_running and info.running_cnt else ""
    )
    say_done(f"paused task {info.key!r} ({info.status.value}{stopping})")


@tasks_app.command("resume", short_help="Make a paused task claimable again.")
@connected
def tasks_resume(
    conn: Connection,
    key: KeyArg,
) -> None:
    """Make the paused task KEY claimable again."""
    info = run(conn, lambda ops: ops.resume(key))
    say_done(f"resumed task {info.key!r} ({info.status.value})")


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
    say_done(f"task {info.key!r} is now {info.status.value}")


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
    deadline: Annotated[
        str | None,
        typer.Option(metavar="TIME", help="The new deadline (ISO-8601); else a past one is dropped."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run tasks KEY... again if failed, cancelled or expired (succeeded: with --force), or
    every task of --status (and --name); --deadline gives them a new deadline (an expired task
    restarts without one otherwise). Many tasks: a progress bar on stderr, a line per task not
    restarted, exit 1 if any was not."""
    if bool(keys) == (status is not None) or (name is not None and status is None):
        message = "give KEY... or --status STATUS [--name NAME], not both"
        raise exit_with(CliError(message, exit_code=EXIT_USAGE))
    new_deadline = parse_instant(deadline, "--deadline")
    if keys and len(keys) == 1 and not as_json:
        info = run(conn, lambda ops: ops.restart(keys[0], force=force, deadline=new_deadline))
        say_done(f"restarted task {info.key!r} (now {info.status.value})")
        return
    show_progress = not as_json and err.is_terminal

    async def restart(ops: Ops) -> list[Any]:
        chosen = list(keys or ()) or await select_keys(ops, str(status), name)
        return await restart_keys(ops, chosen, force, show_progress, new_deadline)

    if not print_restarts(run(conn, restart), as_json):
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
    say_done(f"removed task {key!r}")


@tasks_app.command("send", short_help="Send a task (idempotent by key).")
@connected
def tasks_send(
    conn: Connection,
    name: Annotated[str, typer.Argument(metavar="NAME", hidden=True)],
    key: Annotated[str, typer.Option(metavar="KEY", help="The task's unique key.")],
    params: Annotated[
        str | None,
        typer.Option(metavar="JSON", help="The params, as JSON; @FILE reads them from FILE, - from stdin."),
    ] = None,
    priority: PriorityOpt = None,
    run_at: RunAtOpt = None,
    deadline: DeadlineOpt = None,
    max_retries: RetriesOpt = None,
    retry_delay: RetryDelayOpt = None,
    specific_worker: WorkerOpt = None,
    fair_key: Annotated[
        str | None,
        typer.Option(metavar="KEY", help="A fairness key (a tenant): claims rotate across keys."),
    ] = None,
    aging: Annotated[
        float | None,
        typer.Option(metavar="SECONDS", help="Gain one priority level per SECONDS of wait."),
    ] = None,
    unique_by_params: Annotated[
        bool, typer.Option("--unique-by-params", help="No second live task with these params.")
    ] = False,
    reset_finished: Annotated[
        bool, typer.Option("--reset-finished", help="Reset a finished task with this key.")
    ] = False,
    allow_unknown: Annotated[
        bool,
        typer.Option(
            "--allow-unknown", help="Send it even if no live worker handles NAME (one is on its way)."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Send task NAME with --key and --params (JSON, @FILE or - for stdin). A key that exists is
    left alone (exit 0, "exists"); --reset-finished resets a succeeded or failed one. NAME must
    be handled by a live worker (exit 2 naming the handled ones; --allow-unknown sends it
    anyway) and the params must fit the JSON schema its workers publish (exit 2 naming the
    field). --fair-key puts it in a tenant's lane (among due tasks of one priority, claims
    rotate across keys); --aging raises its priority by one level per SECONDS it waits. With
    --api-url it goes through POST /api/v1/tasks (an admin or publish token)."""
    fields = option_fields(priority, run_at, deadline, max_retries, retry_delay, specific_worker)
    if fair_key is not None:
        fields["fair_key"] = fair_key
    if aging is not None:
        fields["aging"] = timedelta(seconds=aging)
    try:
        task = Task(
            key,
            name,
            json_value(read_text(params, "--params"), "--params"),
            option=TaskOption(**fields),
            unique_by="params" if unique_by_params else "key",
        )
    except (ValidationError, InvalidInput) as exc:
        raise invalid(exc, "task") from None

    async def send(ops: Ops) -> bool:
        return await ops.send(task, reset_finished=reset_finished, allow_unknown=allow_unknown)

    created = run(conn, send)
    if as_json:
        print_json({"key": task.key, "created": created})
    else:
        say_done(
            f"sent task {task.key!r} ({name})" if created else f"task {task.key!r} exists (left as it is)"
        )


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
    fields = option_fields(priority, run_at, deadline, max_retries, retry_delay, specific_worker)
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
        say_done(f"edited task {key!r}: {changed}")


RESTART_BATCH = 100  # keys per Operations.restart_many call (its own limit is MANY_MAX)


async def select_keys(ops: Ops, status: str, name: str | None) -> list[str]:
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


async def restart_keys(
    ops: Ops, keys: list[str], force: bool, show_progress: bool, deadline: datetime | None = None
) -> list[Any]:
    """``restart_many`` in batches, with a progress bar on stderr when asked."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    outcomes: list[Any] = []
    columns = (TextColumn("restarting"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err, transient=True, disable=not show_progress) as progress:
        bar = progress.add_task("restart", total=len(keys))
        for start in range(0, len(keys), RESTART_BATCH):
            batch = keys[start : start + RESTART_BATCH]
            outcomes.extend((await ops.restart_many(batch, force=force, deadline=deadline)).values())
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


app.add_typer(tasks_app)
