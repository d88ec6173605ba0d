"""``mscheduler plans``: list, show, add, suspend, resume, skip and remove recurring plans. Same
options and exit codes as the other operator commands (``mscheduler.cli.common``); a plan's input
is validated by the domain's ``Plan`` model and nothing else.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from mscheduler.cli.common import (
    EXITS,
    Connection,
    JsonOpt,
    PriorityOpt,
    RetriesOpt,
    app,
    command_group,
    connected,
    invalid,
    json_value,
    option_fields,
    out,
    parse_instant,
    print_json,
    run,
    say_done,
    usage,
)
from mscheduler.cli.render import plan_detail, plan_rows
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import TaskOption
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import PlanTiming

plans_app = command_group("plans", f"List, show and steer recurring plans. {EXITS}")


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
    say_done(f"suspended plan {info.plan_id!r} ({info.state.value})")


@plans_app.command("resume", short_help="Resume a suspended or failing plan.")
@connected
def plans_resume(
    conn: Connection,
    plan_id: PlanArg,
) -> None:
    """Resume plan ID if suspended or parked in the error state."""
    info = run(conn, lambda ops: ops.resume_plan(plan_id))
    say_done(f"resumed plan {info.plan_id!r} ({info.state.value})")


@plans_app.command("skip", short_help="Skip a plan's next N occurrences.")
@connected
def plans_skip(
    conn: Connection,
    plan_id: PlanArg,
    n: Annotated[int, typer.Argument(metavar="N", hidden=True)] = 1,
) -> None:
    """Skip the next N occurrences of plan ID (default 1; sets the count: 0 cancels skips)."""
    info = run(conn, lambda ops: ops.skip_plan(plan_id, n))
    say_done(f"plan {info.plan_id!r} skips its next {info.skip_next} occurrence(s)")


@plans_app.command("remove", short_help="Delete a plan (its tasks stay).")
@connected
def plans_remove(
    conn: Connection,
    plan_id: PlanArg,
) -> None:
    """Delete plan ID; the tasks it already made stay."""
    run(conn, lambda ops: ops.remove_plan(plan_id))
    say_done(f"removed plan {plan_id!r}")


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
        first = parse_instant(start, "--start")
        schedule: dict[str, Any]
        if cron is not None:
            schedule = {"kind": "cron", "expression": cron}
        elif every is not None:
            schedule = {"kind": "every", "interval": every, "start": first or datetime.now(UTC)}
        else:
            schedule = {"kind": "at", "at": parse_instant(at, "--at")}
        fields = option_fields(priority, None, None, max_retries, None, None)
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
                        "end": parse_instant(end, "--end"),
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


app.add_typer(plans_app)
