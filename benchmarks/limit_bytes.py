"""Bytes a flow-limit write costs on the server, from a limit of 10 to one of 10,000 (issue 18.2).

For each size N: a limit with ``max_running=N`` and a rate of N per second, filled with N - 1 live
slots and as many starts spread over the window (a saturated limit, filled 500 at a time); a
period after the first fill, one acquire that grants the last slot (and prunes the first fill's
starts, which left the window), one extension of a slot and one release, each on the Mongo
driver over mongomock. Per write:

* ``command``: the BSON size of the update the driver sends (filter, pipeline and literals);
* ``oplog``: what the server would log for it, the delta between the document before and after
  (``benchmarks/oplog_delta.py``: ``$v: 2`` diffs; a replacement when the diff is not smaller);
* ``reply``: the BSON size of the document the write returns (``find_one_and_update``);
* ``document``: the limit document's size after.

Only byte counts: mongomock's timings mean nothing and are not taken. The script uses the drivers'
public operations only, so it runs against any build (``PYTHONPATH=<checkout>``), e.g. the build
before the redesign: ``PYTHONPATH=/work/build-shape python -m benchmarks.limit_bytes``.

    python -m benchmarks.limit_bytes [--sizes 10,100,1000,10000]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import bson

from benchmarks.oplog_delta import bson_size, oplog_bytes
from mscheduler.domain.limits import Limit
from mscheduler.drivers.base import AcquireParams, PutLimitParams, SlotsParams
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
PERIOD = timedelta(seconds=1)
FILL_BATCH = 500


class _Recorder:
    """The limits collection, recording each ``find_one_and_update``'s command and reply."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.last: dict[str, Any] = {}

    async def find_one_and_update(self, filter_: Any, update: Any, **kwargs: Any) -> Any:
        reply = await self._inner.find_one_and_update(filter_, update, **kwargs)
        command = {"q": filter_, "u": update, "fields": kwargs.get("projection") or {}}
        self.last = {"command": len(bson.encode(_plain(command))), "reply": bson_size(reply or {})}
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _plain(value: Any) -> Any:
    """Lists of stages as a BSON document can hold them (a pipeline is a BSON array)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


async def measure(size: int) -> dict[str, Any]:
    database = mongomock_database(f"limit_bytes_{size}")
    driver = MongoDriver(database)
    await driver.setup()
    limit = Limit(key="job", max_running=size, rate=f"{size}/s")
    await driver.put_limit(PutLimitParams("job", limit.to_storage(), NOW))
    tokens = [f"t{i:05}" for i in range(size - 1)]
    batches = range(0, len(tokens), FILL_BATCH)
    step = PERIOD / len(batches)
    for n, start in enumerate(batches):
        # spread over the rate's period, so that the measured acquire, a period after the
        # first batch, finds that batch's starts out of the window (pruned by the acquire)
        at = NOW + n * step
        batch = tokens[start : start + FILL_BATCH]
        result = await driver.acquire_slots(AcquireParams("job", f"w{start}", batch, at, at + LEASE))
        assert len(result.granted) == len(batch), (size, start, len(result.granted))
    recorder = _Recorder(driver.limits)
    driver.limits = recorder
    raw = database["mscheduler_limits"]
    writes: dict[str, Any] = {}

    async def one(what: str, operation: Any) -> None:
        before = copy.deepcopy(await raw.find_one({"_id": "job"}))
        await operation()
        after = await raw.find_one({"_id": "job"})
        oplog, kind = oplog_bytes(before, after)
        writes[what] = recorder.last | {"oplog": oplog, "oplog_kind": kind, "document": bson_size(after)}

    later = NOW + PERIOD + timedelta(milliseconds=1)
    await one(
        "acquire",
        lambda: driver.acquire_slots(AcquireParams("job", "w-last", ["last"], later, later + LEASE)),
    )
    await one(
        "extend",
        lambda: driver.update_slots(SlotsParams("job", "w0", later, extend={tokens[0]: later + 2 * LEASE})),
    )
    await one("release", lambda: driver.update_slots(SlotsParams("job", "w0", later, release=[tokens[1]])))
    return {"size": size, "writes": writes}


async def main(sizes: list[int]) -> list[dict[str, Any]]:
    return [await measure(size) for size in sizes]


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| N | write | command | oplog | reply | document |", "|---|---|---|---|---|---|"]
    for result in results:
        for what, w in result["writes"].items():
            oplog = f"{w['oplog']:,}" + (" (whole document)" if w["oplog_kind"] == "replacement" else "")
            sizes = f"{w['command']:,} | {oplog} | {w['reply']:,} | {w['document']:,}"
            lines.append(f"| {result['size']:,} | {what} | {sizes} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    args = parser.parse_args()
    results = asyncio.run(main([int(n) for n in args.sizes.split(",")]))
    print(json.dumps(results) if args.json else table(results))
