"""Benchmark 12 (issue 18 C): what only a real MongoDB can say - run it against a replica set.

    python -m benchmarks.real_server --mongodb-uri URI [--tasks 20000] [--consumers 4]
        [--concurrency 30] [--variants plain,limit,events,limit+events] [--partitions 1]
        [--database NAME] [--keep]

Per variant, on collections of their own (a prefix per variant in one scratch database, dropped at
the end unless ``--keep``): ``setup_store`` (the variant's layout, ``--partitions``), ``N`` no-op
tasks published in batches of 1,000 (not timed), then ``--consumers`` consumers in this process
(one ``MongoDriver``, ``--concurrency`` each) burn them down. Variants: ``plain``; ``limit`` (a
flow limit ``max_running=100000`` on the name: never reached, its slots are written); ``events``
(the event log on); ``limit+events``. One JSON line per variant:

* ``tasks_per_s``: from the first claim to the last success (and per tenth of the run);
* ``claim_ms``: p50 / p99 / max of the claim round trips that claimed something (client side,
  the claim command and its retries), ``empty_claims_per_task`` (claims that found nothing: lost
  races and polls);
* ``commands_per_task``: ``MongoDriver.commands`` (every command sent, retries included) during the
  burn-down, and by operation;
* ``write_conflicts_per_task``: ``serverStatus`` ``metrics.operation.writeConflicts`` during the
  burn-down (server-wide: run it on a quiet server);
* ``oplog_bytes_per_task``: the ``$bsonSize`` of the oplog entries of the variant's collections
  (transactions' ``applyOps`` entries included) written while publishing and while burning down,
  per task (needs read access to ``local``; ``null`` with the reason otherwise);
* ``index_keys_per_task``: per collection, the index entries written (WiredTiger cursor
  ``insert calls`` + ``remove calls`` of each index, from ``$collStats`` ``storageStats``) while
  burning down, per task, and the busiest indexes; approximate (WiredTiger counts calls, and a
  data handle closed meanwhile resets them);
* ``documents_updated_per_task`` (``serverStatus`` ``metrics.document.updated``, server-wide).

``--mongomock`` runs it on mongomock (the smoke test's way: it checks the plumbing; mongomock's
figures mean nothing and its server-side counters are ``null``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import statistics
import time
import uuid
from collections import Counter
from typing import Any

from benchmarks.common import TASK_NAME, BurnDown, emit, machine, noop_handler, noop_tasks
from mscheduler.cli.setup import setup_store
from mscheduler.drivers.base import ClaimedTask, ClaimParams
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.operations import Operations
from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.publisher import Publisher

VARIANTS = ("plain", "limit", "events", "limit+events")
PUBLISH_BATCH = 1000
NEVER_REACHED = 100_000


class TimedDriver(MongoDriver):
    """A ``MongoDriver`` that times its claims and counts commands by operation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claim_ms: list[float] = []
        self.empty_claims = 0
        self.by_operation: Counter[str] = Counter()

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        start = time.perf_counter()
        claimed = await super().claim(params)
        if claimed:
            self.claim_ms.append((time.perf_counter() - start) * 1000)
        else:
            self.empty_claims += 1
        return claimed

    async def _call(self, what: str, operation: Any, **kwargs: Any) -> Any:
        self.by_operation[what] += 1
        return await super()._call(what, operation, **kwargs)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


class Server:
    """The server-side counters (``None`` where the server or the user cannot tell)."""

    def __init__(self, client: Any, database: Any) -> None:
        self.client = client
        self.database = database
        self.why: dict[str, str] = {}

    async def status(self) -> dict[str, int] | None:
        try:
            status = await self.client.admin.command("serverStatus")
        except Exception as exc:  # mongomock, or no clusterMonitor role
            self.why["serverStatus"] = str(exc)[:200]
            return None
        metrics = status.get("metrics", {})
        return {
            "write_conflicts": int(metrics.get("operation", {}).get("writeConflicts", 0)),
            "documents_updated": int(metrics.get("document", {}).get("updated", 0)),
        }

    async def oplog_position(self) -> Any:
        try:
            oplog = self.client.local["oplog.rs"]
            last = await oplog.find({}, {"ts": 1}).sort("$natural", -1).limit(1).to_list(1)
        except Exception as exc:
            self.why["oplog"] = str(exc)[:200]
            return None
        return last[0]["ts"] if last else None

    async def oplog_bytes(self, since: Any, prefix: str) -> int | None:
        """The oplog entries after ``since`` about the collections named ``<db>.<prefix>...``."""
        if since is None:
            return None
        names = re.escape(f"{self.database.name}.{prefix}")
        match = {
            "ts": {"$gt": since},
            "$or": [{"ns": {"$regex": f"^{names}"}}, {"o.applyOps.ns": {"$regex": f"^{names}"}}],
        }
        pipeline = [{"$match": match}, {"$group": {"_id": None, "bytes": {"$sum": {"$bsonSize": "$$ROOT"}}}}]
        try:
            cursor = await self.client.local["oplog.rs"].aggregate(pipeline)
            rows = await cursor.to_list(None)
        except Exception as exc:
            self.why["oplog"] = str(exc)[:200]
            return None
        return int(rows[0]["bytes"]) if rows else 0

    async def index_writes(self, collection: Any) -> dict[str, int] | None:
        """Per index: WiredTiger cursor insert + remove calls (summed over shards)."""
        try:
            cursor = await collection.aggregate([{"$collStats": {"storageStats": {}}}])
            rows = await cursor.to_list(None)
        except Exception as exc:
            self.why["collStats"] = str(exc)[:200]
            return None
        writes: Counter[str] = Counter()
        for row in rows:
            for name, details in row.get("storageStats", {}).get("indexDetails", {}).items():
                calls = details.get("cursor", {})
                writes[name] += int(calls.get("insert calls", 0)) + int(calls.get("remove calls", 0))
        return dict(writes)


def _delta(after: dict[str, int] | None, before: dict[str, int] | None) -> dict[str, int] | None:
    if after is None or before is None:
        return None
    return {k: after[k] - before.get(k, 0) for k in after}


async def run_variant(
    client: Any, database: Any, variant: str, args: argparse.Namespace, server: Server
) -> dict[str, Any]:
    limit, events = "limit" in variant, "events" in variant
    prefix = f"b{uuid.uuid4().hex[:6]}_"
    await setup_store(database, prefix=prefix, events=events, partitions=args.partitions)
    driver = TimedDriver(database, prefix=prefix, events=events)
    await driver.prepare()
    if limit:
        await Operations(driver).set_limit(TASK_NAME, max_running=NEVER_REACHED)
    collections = {"tasks": driver.tasks, "limits": driver.limits, "workers": driver.workers}
    if events:
        collections["events"] = driver.events

    oplog_start = await server.oplog_position()
    publisher = Publisher(driver)
    for start in range(0, args.tasks, PUBLISH_BATCH):
        await publisher.send_many(noop_tasks(min(PUBLISH_BATCH, args.tasks - start), start))
    oplog_published = await server.oplog_position()
    publish_bytes = await server.oplog_bytes(oplog_start, prefix)

    status_before = await server.status()
    keys_before = {name: await server.index_writes(c) for name, c in collections.items()}
    commands_before, by_operation_before = driver.commands, Counter(driver.by_operation)
    run = BurnDown(expected=args.tasks)
    consumers = []
    for _ in range(args.consumers):
        consumer = Consumer(driver, concurrency=args.concurrency, planner=False)
        consumer.register(TASK_NAME, noop_handler)
        consumer.add_listener(run.listener)
        consumers.append(consumer)
    async with contextlib.AsyncExitStack() as stack:
        for consumer in consumers:
            await stack.enter_async_context(consumer)
        await asyncio.wait_for(run.done.wait(), timeout=args.timeout)
    if run.outcomes != {"succeeded": args.tasks}:
        raise RuntimeError(f"not every task succeeded: {run.outcomes}")
    commands = driver.commands - commands_before
    by_operation = driver.by_operation - by_operation_before
    status = _delta(await server.status(), status_before)
    burn_bytes = await server.oplog_bytes(oplog_published, prefix)
    keys: dict[str, Any] = {}
    busiest: dict[str, float] = {}
    for name, collection in collections.items():
        written = _delta(await server.index_writes(collection), keys_before[name])
        if written is None:
            keys[name] = None
            continue
        keys[name] = round(sum(written.values()) / args.tasks, 2)
        for index, n in written.items():
            busiest[f"{name}.{index}"] = round(n / args.tasks, 2)
    per_task = args.tasks
    return {
        "benchmark": "real_server",
        "variant": variant,
        "tasks": args.tasks,
        "consumers": args.consumers,
        "concurrency": args.concurrency,
        "partitions": driver.partitions,
        "tasks_per_s": round(run.rate),
        "window_tasks_per_s": [round(r) for r in run.window_rates()],
        "claim_ms": {
            "p50": percentile(driver.claim_ms, 0.5),
            "p99": percentile(driver.claim_ms, 0.99),
            "max": round(max(driver.claim_ms), 2) if driver.claim_ms else None,
            "mean": round(statistics.fmean(driver.claim_ms), 2) if driver.claim_ms else None,
            "claims": len(driver.claim_ms),
        },
        "empty_claims_per_task": round(driver.empty_claims / per_task, 3),
        "commands_per_task": round(commands / per_task, 3),
        "by_operation": dict(by_operation.most_common()),
        "write_conflicts_per_task": round(status["write_conflicts"] / per_task, 3) if status else None,
        "documents_updated_per_task": round(status["documents_updated"] / per_task, 3) if status else None,
        "oplog_bytes_per_task": {
            "publish": round(publish_bytes / per_task) if publish_bytes is not None else None,
            "burn_down": round(burn_bytes / per_task) if burn_bytes is not None else None,
        },
        "index_keys_per_task": keys,
        "busiest_indexes": dict(sorted(busiest.items(), key=lambda kv: -kv[1])[:8]),
        "limit_commands": dict(sum((Counter(c.limiter.commands) for c in consumers), Counter()))
        if limit
        else None,
        "unavailable": dict(server.why) or None,
        "machine": machine(),
    }


async def main(args: argparse.Namespace) -> None:
    if args.mongomock:
        from mscheduler.testing.mongomock import mongomock_database

        database = mongomock_database()
        client = getattr(database, "client", None)
    else:
        from pymongo import AsyncMongoClient

        client = AsyncMongoClient(args.mongodb_uri)
        database = client[args.database or f"mscheduler_bench_{uuid.uuid4().hex[:8]}"]
    server = Server(client, database)
    try:
        for variant in args.variants:
            server.why.clear()
            emit(await run_variant(client, database, variant, args, server))
    finally:
        if not args.mongomock:
            if not args.keep:
                await client.drop_database(database.name)
            await client.close()


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--mongodb-uri", metavar="URI", help="a replica set (or a mongos)")
    source.add_argument("--mongomock", action="store_true", help="the plumbing only (figures mean nothing)")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--partitions", type=int, default=None, help="the store's partitions (setup)")
    parser.add_argument(
        "--variants",
        type=lambda text: [v.strip() for v in text.split(",")],
        default=list(VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)}",
    )
    parser.add_argument("--database", default=None, help="default: a scratch database, dropped after")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per burn-down")
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
