"""Benchmark 5: a claim's cost does not grow with tasks aimed at other workers (issue 6, A3).

A backlog of ``--targeted`` due tasks aimed at a worker that never comes (``absent``), plus
``--free`` due tasks anyone may take. Worker ``w1`` claims the free ones one at a time. Reported:
documents examined per claim (the MemoryDriver's ``examined`` counter, the counterpart of
MongoDB's ``docsExamined``; on a real server ``tests/real/test_query_plans.py`` asserts the same
with ``explain``) and the mean time per claim, for the backlog and for a run with no targeted
tasks. The claim reads only the index ranges of ``w1``'s tokens (``job|w1`` and ``job|*``), so
both figures should be the same.

    python -m benchmarks.claim_examined [--targeted 100000] [--free 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from datetime import UTC, datetime

from benchmarks.common import emit
from mscheduler.domain.model import TaskOption
from mscheduler.drivers.base import ClaimParams, InsertParams, NewTask
from mscheduler.drivers.memory.driver import MemoryDriver

NOW = datetime(2030, 1, 1, tzinfo=UTC)


async def run(targeted: int, free: int) -> dict[str, float]:
    driver = MemoryDriver()
    aimed = TaskOption(specific_worker_ids=("absent",)).to_storage(NOW)
    anyone = TaskOption().to_storage(NOW)
    tasks = [NewTask(f"t{i}", "job", None, aimed) for i in range(targeted)]
    tasks += [NewTask(f"f{i}", "job", None, anyone) for i in range(free)]
    await driver.insert_tasks(InsertParams(tasks, NOW))
    driver.examined = 0
    started = time.perf_counter()
    claimed = 0
    for _ in range(free):
        params = ClaimParams("w1", ["job"], NOW, [secrets.token_hex(8)])
        claimed += len(await driver.claim(params))
    seconds = time.perf_counter() - started
    assert claimed == free, (claimed, free)
    return {
        "examined_per_claim": driver.examined / free,
        "us_per_claim": seconds / free * 1e6,
    }


async def main(targeted: int, free: int) -> None:
    backlog = await run(targeted, free)
    baseline = await run(0, free)
    emit(
        {
            "benchmark": "claim_examined",
            "targeted_at_absent_worker": targeted,
            "free": free,
            "examined_per_claim": round(backlog["examined_per_claim"], 2),
            "examined_per_claim_without_backlog": round(baseline["examined_per_claim"], 2),
            "us_per_claim": round(backlog["us_per_claim"], 1),
            "us_per_claim_without_backlog": round(baseline["us_per_claim"], 1),
        }
    )


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--targeted", type=int, default=100_000)
    parser.add_argument("--free", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.targeted, args.free))


if __name__ == "__main__":
    cli()
