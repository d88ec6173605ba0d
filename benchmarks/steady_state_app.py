"""The app ``benchmarks.steady_state --dev`` runs under ``mscheduler dev``: the in-process run's
consumer settings, handlers and plan, and a ``probe`` task that measures the dev process from
inside (its RSS, its event loop's lag, its consumer's outcomes and the named structures' sizes),
writing one JSON line per sample to ``$STEADY_PROBE_FILE`` until ``$STEADY_STOP_FILE`` exists."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.steady_state import PLAN_EVERY, RETENTION_SECONDS, LagProbe, Outcomes, lag_fields, rss_mb
from mscheduler import App, Consumer, EverySchedule, MemoryDriver, Plan, PlanTiming, Retention

KEPT = timedelta(seconds=RETENTION_SECONDS)

app = App("steady")
app.consumer(
    concurrency=30,
    retention=Retention(succeeded=KEPT, failed=KEPT, cancelled=KEPT, expired=KEPT),
    retention_interval=RETENTION_SECONDS,
)
app.plan(
    Plan(
        plan_id="steady-tick",
        name="planned",
        timing=PlanTiming(schedule=EverySchedule(interval=PLAN_EVERY, start=datetime.now(UTC))),
    )
)


@app.handler("noop")
async def noop() -> None:
    return None


@app.handler("limited")
async def limited() -> None:
    return None


@app.handler("planned")
async def planned() -> None:
    return None


def _the_one(kind: type) -> Any:
    """The process's one object of ``kind`` (found once, at the probe's start)."""
    found = [o for o in gc.get_objects() if isinstance(o, kind)]
    if len(found) != 1:
        raise RuntimeError(f"expected one {kind.__name__} in the dev process, found {len(found)}")
    return found[0]


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


@app.handler("probe")
async def probe() -> None:
    out = Path(os.environ["STEADY_PROBE_FILE"])
    stop = Path(os.environ["STEADY_STOP_FILE"])
    every = float(os.environ.get("STEADY_SAMPLE", "30"))
    driver: MemoryDriver = _the_one(MemoryDriver)
    consumer: Consumer = _the_one(Consumer)
    outcomes = Outcomes()
    consumer.add_listener(outcomes.listener)
    lag = LagProbe()
    probing = asyncio.ensure_future(lag.run())
    begin = time.monotonic()
    samples = 0
    await asyncio.to_thread(out.touch)  # the benchmark starts its load when the probe listens
    try:
        while not await asyncio.to_thread(stop.exists):
            samples += 1
            await asyncio.sleep(max(0.0, begin + samples * every - time.monotonic()))
            lags = lag.take()
            own = driver.structure_sizes()
            sample = {
                "t": round(time.monotonic() - begin, 1),
                "rss_mb": round(rss_mb(), 1),
                **lag_fields(lags),
                "lags": [round(x, 5) for x in lags],
                "done": outcomes.succeeded,
                "outcomes": outcomes.by_outcome,
                "stored": own["tasks"],
                "sizes": {
                    **{f"store.{k}": v for k, v in own.items()},
                    **{f"consumer.{k}": v for k, v in consumer.structure_sizes().items()},
                },
            }
            await asyncio.to_thread(_append, out, json.dumps(sample))
    finally:
        probing.cancel()
