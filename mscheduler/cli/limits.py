"""``mscheduler limits``: list, show, set and remove flow limits (``Operations.set_limit`` and
friends; see docs/features.md, "Flow limits"). Same options and exit codes as the other operator
commands (``mscheduler.cli.common``): 0 done; 1 an unknown limit; 2 bad input (nothing written); 3
MongoDB unreachable or failing."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from mscheduler.cli.common import (
    Connection,
    JsonOpt,
    app,
    command_group,
    connected,
    out,
    print_json,
    run,
    say_done,
    shown_time,
)
from mscheduler.domain.limits import LimitInfo

limits_app = command_group(
    "limits",
    "List, show, set and remove flow limits. A limit caps the attempts running at once "
    "and / or the starts per period of its task names across the cluster. Exits 1 for an "
    "unknown limit, 2 on bad input, 3 if MongoDB fails.",
)
LimitArg = Annotated[str, typer.Argument(metavar="KEY", hidden=True)]


def _json(info: LimitInfo) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        return value.isoformat() if isinstance(value, datetime) else value

    doc = info.as_dict()
    doc["holders"] = [{k: plain(v) for k, v in holder.items()} for holder in doc["holders"]]
    doc["update_time"] = plain(doc["update_time"])
    return doc


def _rate(info: LimitInfo) -> str:
    rate = info.limit.rate
    return "" if rate is None else f"{rate.n} per {rate.period.total_seconds():g} s"


def _max(info: LimitInfo) -> str:
    return "" if info.limit.max_running is None else str(info.limit.max_running)


def limit_rows(limits: list[LimitInfo]) -> Table:
    table = Table(title=f"limits ({len(limits)})")
    for column in ("key", "names", "max running", "running", "rate", "starts in window"):
        table.add_column(column)
    for info in limits:
        table.add_row(
            info.limit.key,
            ", ".join(info.limit.names),
            _max(info),
            str(info.running),
            _rate(info),
            str(info.recent_starts) if info.limit.rate is not None else "",
        )
    return table


def limit_detail(info: LimitInfo) -> list[Table]:
    head = Table(title=f"limit {info.limit.key}", show_header=False)
    head.add_column("field")
    head.add_column("value")
    for field, value in (
        ("names", ", ".join(info.limit.names)),
        ("max running", _max(info)),
        ("running", str(info.running)),
        ("rate", _rate(info)),
        ("starts in window", str(info.recent_starts) if info.limit.rate is not None else ""),
        ("updated", shown_time(info.update_time)),
    ):
        head.add_row(field, value)
    holders = Table(title="slots")
    for column in ("worker", "attempt", "expires"):
        holders.add_column(column)
    for worker_id, attempt, expire in info.holders:
        holders.add_row(worker_id, attempt, shown_time(expire))
    return [head, holders]


@limits_app.command("ls", short_help="List flow limits.")
@connected
def limits_ls(
    conn: Connection,
    as_json: JsonOpt = False,
) -> None:
    """List flow limits with their names, running slots and rate."""
    limits = run(conn, lambda ops: ops.list_limits())
    if as_json:
        print_json([_json(info) for info in limits])
    else:
        out.print(limit_rows(limits))


@limits_app.command("show", short_help="Show a flow limit and its slots.")
@connected
def limits_show(
    conn: Connection,
    key: LimitArg,
    as_json: JsonOpt = False,
) -> None:
    """Show limit KEY: its names, values, running slots (who holds them) and recent starts."""
    info = run(conn, lambda ops: ops.get_limit(key))
    if as_json:
        print_json(_json(info))
    else:
        for table in limit_detail(info):
            out.print(table)


@limits_app.command("set", short_help="Create or replace a flow limit.")
@connected
def limits_set(
    conn: Connection,
    key: LimitArg,
    names: Annotated[
        str | None,
        typer.Option(metavar="A,B", help="Task names it covers, comma-separated (default: KEY)."),
    ] = None,
    max_running: Annotated[
        int | None, typer.Option(metavar="N", help="Attempts running at once (0 holds back).")
    ] = None,
    rate: Annotated[
        str | None, typer.Option(metavar="N/PERIOD", help="Starts per period: 10/s, 1000/h, 5/2m.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create or replace limit KEY: --max-running, --rate or both, over --names (default KEY).
    Applies to every consumer's next claim."""
    listed = None if names is None else [n.strip() for n in names.split(",")]
    info = run(conn, lambda ops: ops.set_limit(key, names=listed, max_running=max_running, rate=rate))
    if as_json:
        print_json(_json(info))
        return
    values = ", ".join(v for v in (f"max running {_max(info)}" if _max(info) else "", _rate(info)) if v)
    say_done(f"set limit {info.limit.key!r} on {', '.join(info.limit.names)}: {values}")


@limits_app.command("rm", short_help="Remove a flow limit.")
@connected
def limits_rm(
    conn: Connection,
    key: LimitArg,
) -> None:
    """Remove limit KEY: its names are unlimited from every consumer's next limit refresh."""
    run(conn, lambda ops: ops.remove_limit(key))
    say_done(f"removed limit {key!r}")


app.add_typer(limits_app)
