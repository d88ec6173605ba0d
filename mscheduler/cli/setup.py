"""``mscheduler setup``: make a MongoDB store ready, once, before its workers start.

Index building is an administrator's step: ``createIndexes`` waits for the commit quorum of a
replica set, which a consumer's start should not (and a fleet of consumers should not all try).
Consumers, publishers and ``mscheduler worker`` / ``web`` check the indexes and refuse to start
without them, naming what is missing. ``setup`` builds every index of this build, rebuilds one
whose spec changed since the build that made the store, and drops the retired ones.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

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
from mscheduler.domain.events import DEFAULT_RETENTION
from mscheduler.domain.exceptions import MSchedulerError
from mscheduler.domain.partitions import MAX_PARTITIONS
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.drivers.mongo.indexes import existing_indexes


async def setup_store(
    database: Any,
    *,
    prefix: str = "",
    events: bool = False,
    event_retention: timedelta = DEFAULT_RETENTION,
    partitions: int | None = None,
    shards: bool = False,
    **driver_options: Any,
) -> tuple[list[tuple[str, str]], list[str]]:
    """Record the layout (partitions), build the store's indexes and, with ``shards``, shard the
    tasks collection (on a mongos); returns each collection's indexes, and notes: what is still
    missing (nothing, unless the server refused), what was rebuilt or dropped, what was sent to
    shard it."""
    options: dict[str, Any] = {"events": events, "event_retention": event_retention, **driver_options}
    driver = MongoDriver(database, prefix=prefix, partitions=partitions, sharded=shards, **options)
    await driver.setup()
    sharding = await driver.shard() if shards else []
    collections = [driver.tasks, driver.plans, driver.limits, driver.workers]
    if events:
        collections.append(driver.events)
    made = []
    for collection in collections:
        names = [n for n in await existing_indexes(collection) if n != "_id_"]
        made.append((collection.name, ", ".join(names)))
    notes = [f"still missing: {m}" for m in await driver.missing_indexes()]
    if driver.rebuilt:
        notes.append(f"rebuilt or dropped (their spec changed): {', '.join(driver.rebuilt)}")
    notes.append(f"partitions: {driver.partitions}" + (" (sharded)" if driver.sharded else ""))
    notes += [f"sent: {command}" for command in sharding]
    return made, notes


@app.command(short_help="Create the indexes a MongoDB store needs (once, before the workers start).")
def setup(
    mongodb_uri: Annotated[
        str, typer.Option(metavar="URI", help="The server, e.g. mongodb://localhost:27017/?replicaSet=rs0")
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
    events: Annotated[
        bool,
        typer.Option("--events/--no-events", help="Also the event log's indexes (MongoDriver(events=True))."),
    ] = False,
    event_retention_days: Annotated[
        float, typer.Option(metavar="DAYS", help="How long events are kept (their TTL index).")
    ] = DEFAULT_RETENTION.total_seconds() / 86_400,
    partitions: Annotated[
        int | None,
        typer.Option(
            metavar="P",
            min=1,
            max=MAX_PARTITIONS,
            help="The store's partitions (fixed once set; docs/scaling.md). Default: as set, else 1.",
        ),
    ] = None,
    shards: Annotated[
        bool,
        typer.Option("--shards", help="Shard the tasks collection (through a mongos): shard key, zones."),
    ] = False,
    server_selection_timeout_ms: TimeoutMs = None,
) -> None:
    """Create (or update) the store's indexes: tasks, plans, limits, workers and, with
    ``--events``, the event log. Idempotent; an index whose keys or options changed since the
    build that made the store is rebuilt (it is missing while it builds: run it at a quiet time).
    """

    async def run() -> tuple[list[tuple[str, str]], list[str], str]:
        client = mongo_client(mongodb_uri, server_selection_timeout_ms)
        try:
            await ensure_reachable(client, redact(mongodb_uri), hint=URI_TIMEOUT_HINT)
            db = database_of(client, database, "mscheduler")
            retention = timedelta(days=event_retention_days)
            made, notes = await setup_store(
                db,
                prefix=prefix,
                events=events,
                event_retention=retention,
                partitions=partitions,
                shards=shards,
            )
            return made, notes, db.name
        finally:
            await client.close()

    try:
        made, notes, db_name = asyncio.run(run())
    except CliError as exc:
        raise exit_with(exc) from None
    except MSchedulerError as exc:
        raise exit_with(CliError(f"setup failed: {one_line(str(exc), limit=300)}")) from None
    table = Table(title=f"mscheduler setup: {db_name}")
    table.add_column("collection")
    table.add_column("indexes")
    for name, indexes in made:
        table.add_row(name, indexes)
    out.print(table)
    for note in notes:
        out.print(note)
    out.print("ready: workers can start")
