"""``mscheduler events ls`` and ``events tail``: the recorded task events (``Events``), same options
and exit codes as the other operator commands (``mscheduler.cli.common``).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.text import Text

from mscheduler.cli.common import (
    Connection,
    JsonOpt,
    Ops,
    app,
    command_group,
    connected,
    err,
    event_log,
    out,
    parse_instant,
    print_json,
    run,
)
from mscheduler.cli.render import event_line, event_rows
from mscheduler.services.events import LIST_LIMIT_MAX, Event

events_app = command_group(
    "events",
    "List and follow recorded task events. Writers record them with MongoDriver(db, "
    "events=True). Exits 2 on bad input, 3 if MongoDB fails.",
)


# -- events ---------------------------------------------------------------------------------------

EventKeyOpt = Annotated[str | None, typer.Option("--key", metavar="KEY", help="One task's events.")]
EventNameOpt = Annotated[str | None, typer.Option("--name", metavar="NAME", help="Of this task name.")]
KindOpt = Annotated[
    list[str] | None, typer.Option("--kind", metavar="KIND", help="Only this kind (repeatable).")
]
PlanOpt = Annotated[str | None, typer.Option("--plan", metavar="ID", help="Of this plan's runs.")]
SinceOpt = Annotated[str | None, typer.Option(metavar="TIME", help="At or after (ISO-8601).")]


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
    first, last = parse_instant(since, "--since"), parse_instant(until, "--until")

    async def listing(ops: Ops) -> list[Event]:
        return await event_log(ops).list(
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
    first = parse_instant(since, "--since")

    async def follow(ops: Ops) -> int:
        seen = 0
        source = event_log(ops).subscribe(keys=key, names=name, kinds=kind, plans=plan, since=first)
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


app.add_typer(events_app)
