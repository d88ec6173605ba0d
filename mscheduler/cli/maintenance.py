"""``mscheduler maintenance``: the store's background passes without a consumer — expiry (lost
leases, past deadlines), the planner (recurring plans' occurrences) and retention (finished tasks
past their period) — once (``--once``, e.g. from cron) or until SIGINT / SIGTERM.

Consumers run these passes themselves (expiry on every poll, a planner and retention when asked),
so this command is for stores where none runs all the time: only remote executors, workers that
come and go, or an operator who wants a pass now. Any number may run beside consumers: every pass
is a set of idempotent compare-and-sets. The services are the library's (``ExpiryService``,
``Planner``, ``RetentionService``); nothing here decides anything.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from datetime import timedelta
from typing import Annotated

import typer

from mscheduler.cli.common import (
    EXIT_USAGE,
    CliError,
    Connection,
    JsonOpt,
    Ops,
    app,
    connected,
    err,
    exit_with,
    print_json,
    run,
)
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.observability.logs import configure_logging
from mscheduler.operations import Operations
from mscheduler.services.base import PeriodicService
from mscheduler.services.expiry import ExpiryService
from mscheduler.services.planner import Planner
from mscheduler.services.retention import Retention, RetentionService

log = logging.getLogger("mscheduler.maintenance")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_PERIOD = re.compile(r"(\d+)([smhd]?)")
NEVER = "never"


def parse_period(text: str, option: str) -> timedelta | None:
    """``7d``, ``36h``, ``90m``, ``3600s`` or ``3600`` (seconds), or ``never`` (None: kept for
    ever); anything else is a usage error naming the option."""
    text = text.strip().lower()
    if text == NEVER:
        return None
    match = _PERIOD.fullmatch(text)
    if match is None:
        raise CliError(
            f"{option}: a period such as 7d, 36h, 90m or 3600s, or 'never' (got {text!r})",
            exit_code=EXIT_USAGE,
        )
    return timedelta(seconds=int(match[1]) * _UNITS[match[2] or "s"])


def shown_period(period: timedelta | None) -> str:
    """The inverse of ``parse_period`` for the defaults shown in ``--help``."""
    if period is None:
        return NEVER
    seconds = int(period.total_seconds())
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


_DEFAULT = Retention()


def services(
    ops: Operations,
    *,
    expiry: bool,
    planner: bool,
    retention: Retention | None,
    interval: float,
) -> list[PeriodicService]:
    """The passes asked for, on the operations' store and server-corrected clock. Expiry and the
    planner pass every ``interval`` seconds; retention at most once a minute (its deletes are
    batched and its periods are days)."""
    found: list[PeriodicService] = []
    if expiry:
        found.append(ExpiryService(ops.driver, clock=ops.clock, interval=interval))
    if planner:
        found.append(Planner(ops.driver, clock=ops.clock, interval=interval))
    if retention is not None:
        found.append(RetentionService(ops.driver, retention, clock=ops.clock, interval=max(interval, 60.0)))
    return found


def tally(found: list[PeriodicService]) -> dict[str, int]:
    """What the services did so far (the ``--once`` report and the last line of a loop)."""
    done: dict[str, int] = {}
    for service in found:
        if isinstance(service, ExpiryService):
            done.update(leases_lost=service.leases_lost, deadlines_expired=service.deadlines_expired)
        elif isinstance(service, Planner):
            done.update(occurrences=service.materialised)
        elif isinstance(service, RetentionService):
            done.update(removed=service.removed)
    return done


async def pass_once(ops: Operations, found: list[PeriodicService]) -> dict[str, int]:
    """One pass of each service, in order (expiry first: a task that expired is then finished
    for retention, and a plan waiting on it may go on)."""
    await ops.clock.sync(ops.driver.server_time)
    for service in found:
        await service.run_once()
    return tally(found)


async def run_until_stopped(ops: Operations, found: list[PeriodicService]) -> dict[str, int]:
    """Every service's loop, side by side, until SIGINT / SIGTERM (or until each is ``stop``ped);
    a configuration error of one (retrying cannot help) stops them all and is raised."""
    await ops.clock.sync(ops.driver.server_time)
    loop = asyncio.get_running_loop()
    handled = (signal.SIGINT, signal.SIGTERM)

    def stop_all(*_: object) -> None:
        for service in found:
            service.stop()

    for signum in handled:
        loop.add_signal_handler(signum, stop_all)
    try:
        runs = [asyncio.ensure_future(service.run()) for service in found]
        try:
            await asyncio.gather(*runs)
        except BaseException:
            stop_all()
            for task in runs:
                task.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            raise
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
    return tally(found)


def _retention(succeeded: str, failed: str, cancelled: str, expired: str) -> Retention:
    """The retention periods of the command's options (a bad one: exit 2)."""
    try:
        return Retention(
            succeeded=parse_period(succeeded, "--keep-succeeded"),
            failed=parse_period(failed, "--keep-failed"),
            cancelled=parse_period(cancelled, "--keep-cancelled"),
            expired=parse_period(expired, "--keep-expired"),
        )
    except CliError as exc:
        raise exit_with(exc) from None
    except InvalidInput as exc:
        raise exit_with(CliError(str(exc), exit_code=EXIT_USAGE)) from None


@app.command(short_help="Expiry, planner and retention passes without a consumer (or --once).")
@connected
def maintenance(
    conn: Connection,
    once: Annotated[bool, typer.Option("--once", help="One pass of each, print what it did, exit.")] = False,
    interval: Annotated[
        float,
        typer.Option(metavar="SECONDS", min=0.1, max=3600, help="Seconds between expiry and planner passes."),
    ] = 5.0,
    expiry: Annotated[
        bool, typer.Option("--expiry/--no-expiry", help="Mark lost leases, expire past deadlines.")
    ] = True,
    planner: Annotated[
        bool, typer.Option("--planner/--no-planner", help="Make recurring plans' occurrences.")
    ] = True,
    retention: Annotated[
        bool,
        typer.Option(
            "--retention/--no-retention",
            help="Remove finished tasks past their period (and set the store's TTL indexes to them).",
        ),
    ] = True,
    keep_succeeded: Annotated[
        str, typer.Option(metavar="PERIOD", help="Keep succeeded tasks this long (7d, 12h, never).")
    ] = shown_period(_DEFAULT.succeeded),
    keep_failed: Annotated[
        str, typer.Option(metavar="PERIOD", help="Keep failed tasks this long.")
    ] = shown_period(_DEFAULT.failed),
    keep_cancelled: Annotated[
        str, typer.Option(metavar="PERIOD", help="Keep cancelled tasks this long.")
    ] = shown_period(_DEFAULT.cancelled),
    keep_expired: Annotated[
        str, typer.Option(metavar="PERIOD", help="Keep expired tasks this long.")
    ] = shown_period(_DEFAULT.expired),
    as_json: JsonOpt = False,
) -> None:
    """Run the store's background passes without a consumer: expiry (attempts whose lease ran out
    become lost, tasks past their deadline expire), the planner (recurring plans' due
    occurrences become tasks) and retention (finished tasks past their period are removed).

    With --once: one pass of each, then a line of counts (--json: an object) and exit 0. Without:
    until SIGINT / SIGTERM. Retention periods are the store's: the TTL indexes take the periods
    of whichever process set them last, so give consumers (Consumer(retention=...)) the same ones.
    Exits 0 when done or stopped, 1 on a refusal, 2 on bad arguments, 3 when the store is
    unreachable.
    """
    kept = _retention(keep_succeeded, keep_failed, keep_cancelled, keep_expired) if retention else None
    if not (expiry or planner or kept is not None):
        raise exit_with(CliError("nothing to run: every pass is switched off", exit_code=EXIT_USAGE))
    if not once:
        configure_logging(logging.INFO, "text")

    async def body(ops: Ops) -> dict[str, int]:
        if not isinstance(ops, Operations):
            message = "maintenance runs on the store itself: give --mongodb-uri, not --api-url"
            raise CliError(message, exit_code=EXIT_USAGE)
        found = services(ops, expiry=expiry, planner=planner, retention=kept, interval=interval)
        if once:
            return await pass_once(ops, found)
        names = ", ".join(s.what for s in found)
        err.print(f"mscheduler maintenance: {names} every {interval:g}s; Ctrl+C to stop", highlight=False)
        return await run_until_stopped(ops, found)

    done = run(conn, body)
    if as_json:
        print_json(done)
        return
    line = ", ".join(f"{what.replace('_', ' ')}: {count}" for what, count in done.items())
    typer.echo(line if once else f"mscheduler maintenance: stopped ({line})")
