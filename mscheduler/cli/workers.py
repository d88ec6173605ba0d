"""``mscheduler workers``: list registered workers and the task names live ones handle (with
their params' fields); ask one to stop (at its next heartbeat).
Same options and exit codes as the other operator commands (``mscheduler.cli.common``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from mscheduler.cli.common import (
    EXIT_REFUSED,
    EXITS,
    CliError,
    Connection,
    JsonOpt,
    app,
    command_group,
    connected,
    exit_with,
    out,
    print_json,
    run,
    say_done,
    shown_time,
)

workers_app = command_group(
    "workers", f"List registered workers and the task names they handle; ask one to stop. {EXITS}"
)


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
            shown_time(w.last_seen),
        )
    out.print(table)


@workers_app.command("handlers", short_help="The task names live workers handle, with their params.")
@connected
def workers_handlers(
    conn: Connection,
    as_json: JsonOpt = False,
) -> None:
    """The task names live workers handle: how many workers handle each, and the fields of its
    params as the workers' JSON schema has them (required ones marked *); --json: the schemas
    themselves. What tasks send checks a send against."""
    handlers = run(conn, lambda ops: ops.list_handlers())
    if as_json:
        print_json(
            [{"name": h.name, "workers": h.workers, "params_schema": h.params_schema} for h in handlers]
        )
        return
    table = Table(title=f"handlers ({len(handlers)})")
    for column in ("name", "workers", "params"):
        table.add_column(column)
    for h in handlers:
        table.add_row(h.name, str(h.workers), params_summary(h.params_schema))
    out.print(table)


def params_summary(schema: dict[str, Any] | None) -> str:
    """``order_id* integer, email* string, note string|null`` from a params schema ("" for none)."""
    if not schema:
        return "(not checked)"
    shown = []
    required = set(schema.get("required") or ())
    for name, prop in (schema.get("properties") or {}).items():
        kinds = [prop.get("type")] if "type" in prop else [o.get("type") for o in prop.get("anyOf") or ()]
        kind = "|".join(str(k) for k in kinds if k) or ("object" if "$ref" in prop else "any")
        shown.append(f"{name}{'*' if name in required else ''} {kind}")
    return ", ".join(shown) or "(an object)"


@workers_app.command("stop", short_help="Ask a running worker to stop gracefully.")
@connected
def workers_stop(
    conn: Connection,
    worker_id: Annotated[str, typer.Argument(metavar="WORKER_ID", hidden=True)],
) -> None:
    """Ask the running worker WORKER_ID to stop gracefully (at its next heartbeat)."""
    if not run(conn, lambda ops: ops.request_worker_stop(worker_id)):
        raise exit_with(CliError(f"no running worker with id {worker_id!r}", exit_code=EXIT_REFUSED))
    say_done(f"asked worker {worker_id!r} to stop")


app.add_typer(workers_app)
