"""``mscheduler check``: is a MongoDB server ready for the scheduler — reachable, version, a
replica set with change streams, the indexes (``--create-indexes`` makes them)? One line per
check; exit 1 if any fails.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from mscheduler.cli.common import (
    URI_TIMEOUT_HINT,
    CliError,
    TimeoutMs,
    app,
    database_of,
    ensure_reachable,
    exit_with,
    mongo_client,
    one_line,
    out,
    redact,
)
from mscheduler.domain.exceptions import MSchedulerError
from mscheduler.drivers.base import ChangeStreamUnsupported
from mscheduler.drivers.mongo.common import INDEX_NAMES
from mscheduler.drivers.mongo.driver import MongoDriver

OK, WARN, FAIL = "ok", "warn", "fail"
MIN_SERVER_VERSION = (6, 0)


# The indexes MongoDriver.setup() creates (guarded by tests/acceptance/test_check_inprocess.py).
EXPECTED_INDEXES = INDEX_NAMES


CHANGE_STREAM_PROBE_SECONDS = 1.0


@dataclass(slots=True)
class CheckLine:
    name: str
    level: str  # ok / warn / fail
    detail: str


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


async def probe_change_stream(
    driver: MongoDriver, seconds: float = CHANGE_STREAM_PROBE_SECONDS
) -> str | None:
    """Open a change stream through the driver; None if it opened, else why not."""
    stream = driver.watch(["mscheduler.check"])
    try:
        await asyncio.wait_for(anext(stream), seconds)
    except TimeoutError:
        return None  # opened and waited for events: supported
    except StopAsyncIteration:
        return None
    except ChangeStreamUnsupported as exc:
        return str(exc)
    except MSchedulerError as exc:
        return f"error: {exc}"
    finally:
        await stream.aclose()
    return None


async def layout_line(driver: MongoDriver) -> CheckLine:
    """The store's layout as ``mscheduler setup`` recorded it (what every process reads)."""
    try:
        layout = await driver.known_layout()
    except MSchedulerError as exc:
        return CheckLine("layout", FAIL, f"could not read the store's layout: {exc}")
    if not layout.recorded:
        return CheckLine("layout", WARN, "none recorded: run `mscheduler setup` (1 partition until then)")
    shown = f"{layout.partitions} partition" + ("s" if layout.partitions != 1 else "")
    return CheckLine("layout", OK, shown + (", sharded" if layout.sharded else ""))


async def check_server(database: Any, *, prefix: str = "", create_indexes: bool = False) -> list[CheckLine]:
    """What ``mscheduler check`` reports after connecting: version, replica set, streams, indexes."""
    driver = MongoDriver(database, prefix=prefix)
    info = await driver.server_info()
    lines = [_version_line(info), _replica_set_line(info), await layout_line(driver)]
    reason = await probe_change_stream(driver)
    if reason is None:
        lines.append(CheckLine("change streams", OK, "supported: consumers are told about new tasks at once"))
    else:
        lines.append(
            CheckLine("change streams", WARN, f"unavailable ({reason}); consumers fall back to polling")
        )
    lines.append(await _indexes_line(driver, create_indexes))
    return lines


def _version_line(info: dict[str, Any]) -> CheckLine:
    version = info.get("version")
    if not version:
        return CheckLine("server version", WARN, f"unknown ({info.get('version_error', 'no buildInfo')})")
    too_old = _version_tuple(version) < MIN_SERVER_VERSION
    need = ".".join(map(str, MIN_SERVER_VERSION))
    return CheckLine(
        "server version", FAIL if too_old else OK, f"{version}" + (f" (need >= {need})" if too_old else "")
    )


def _replica_set_line(info: dict[str, Any]) -> CheckLine:
    if "hello_error" in info:
        return CheckLine(
            "replica set", WARN, f"could not ask the server (hello failed: {info['hello_error']})"
        )
    if not info.get("replica_set"):
        return CheckLine(
            "replica set",
            WARN,
            "none (standalone server or mongos): transactions (send(session=...)) need a replica set",
        )
    primary = info.get("is_primary")
    return CheckLine(
        "replica set",
        OK if primary else FAIL,
        f"{info['replica_set']}, "
        + (
            "connected to the primary; transactions available"
            if primary
            else "not connected to a primary (writes will fail)"
        ),
    )


async def _indexes_line(driver: MongoDriver, create_indexes: bool) -> CheckLine:
    collection = driver.namespace
    try:
        present = set(await driver.index_names())
        missing = [name for name in EXPECTED_INDEXES if name not in present]
        if missing and create_indexes:
            await driver.setup()
            present = set(await driver.index_names())
            still = [name for name in EXPECTED_INDEXES if name not in present]
            return CheckLine(
                "indexes",
                FAIL if still else OK,
                f"created {', '.join(missing)} on {collection}"
                + (f"; still missing {', '.join(still)}" if still else ""),
            )
        if missing:
            return CheckLine(
                "indexes",
                WARN,
                f"missing on {collection}: {', '.join(missing)} "
                "(run `mscheduler setup` or this check with --create-indexes; workers do not build them)",
            )
        return CheckLine("indexes", OK, f"all {len(EXPECTED_INDEXES)} present on {collection}")
    except Exception as exc:  # a report: every failure is information
        return CheckLine("indexes", FAIL, f"could not read or create indexes on {collection}: {exc}")


@app.command(short_help="Check that a MongoDB server is ready for the scheduler.")
def check(
    mongodb_uri: Annotated[
        str,
        typer.Option(
            metavar="URI", help="The server to check, e.g. mongodb://localhost:27017/?replicaSet=rs0"
        ),
    ],
    database: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="Database the scheduler uses (default: the URI's, else mscheduler)."
        ),
    ] = None,
    prefix: Annotated[
        str, typer.Option(metavar="PREFIX", help="Collection prefix (MongoDriver(prefix=...)).")
    ] = "",
    create_indexes: Annotated[bool, typer.Option("--create-indexes", help="Create missing indexes.")] = False,
    server_selection_timeout_ms: TimeoutMs = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Warnings (no replica set, missing indexes) fail too.")
    ] = False,
) -> None:
    """Check a MongoDB server: connectivity, version, replica set, change streams, indexes.

    Exits 1 if something is broken (or, with --strict, merely not ready), 2 on bad arguments.
    """

    async def run() -> tuple[float, list[CheckLine], str]:
        client = mongo_client(mongodb_uri, server_selection_timeout_ms)
        try:
            rtt = await ensure_reachable(client, redact(mongodb_uri), hint=URI_TIMEOUT_HINT)
            db = database_of(client, database, "mscheduler")
            return rtt, await check_server(db, prefix=prefix, create_indexes=create_indexes), db.name
        finally:
            await client.close()

    try:
        rtt, lines, db_name = asyncio.run(run())
    except CliError as exc:
        raise exit_with(exc) from None
    except MSchedulerError as exc:
        raise exit_with(CliError(f"the check could not run: {one_line(str(exc), limit=300)}")) from None
    lines.insert(
        0, CheckLine("connection", OK, f"{redact(mongodb_uri)} answered in {rtt:.0f} ms (database {db_name})")
    )
    styles = {OK: "green", WARN: "yellow", FAIL: "bold red"}
    table = Table(title="mscheduler check")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for line in lines:
        table.add_row(line.name, Text(line.level.upper(), style=styles[line.level]), line.detail)
    out.print(table)
    failing = [line for line in lines if line.level == FAIL or (strict and line.level == WARN)]
    if failing:
        out.print(Text(f"unhealthy: {', '.join(line.name for line in failing)}", style="bold red"))
        raise typer.Exit(1)
    warned = [line.name for line in lines if line.level == WARN]
    out.print(Text("healthy" + (f" (warnings: {', '.join(warned)})" if warned else ""), style="bold green"))
