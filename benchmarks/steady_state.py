"""Steady state: a fixed rate of no-op tasks for a long time, and whether the process stays flat.

One process runs a store, one consumer (concurrency 30) with retention (succeeded and failed
tasks kept 5 s, a pass every 5 s), the event log on, a recurring plan (every second) and a flow
limit (``max_running=10`` over a tenth of the tasks), and a publisher sending ``--rate`` tasks a
second in batches of ``--batch``. Every ``--sample`` seconds it records the process's RSS, the
event loop's lag (a probe sleeping 50 ms: how late it wakes; p50, p99, p999, max of the window),
the stored tasks and the entries of every named in-memory structure
(``MemoryDriver.structure_sizes``, ``Consumer.structure_sizes``). At the end the sending stops,
the backlog drains and every sent task must have succeeded (``lost`` counts the others).

    python -m benchmarks.steady_state --driver memory --duration 3600 --json mem.json --plot mem.png
    python -m benchmarks.steady_state --driver mongomock --rate 20 --batch 2 --duration 3600 ...
    python -m benchmarks.steady_state --dev --duration 3600 --json dev.json --plot dev.png

``--dev`` runs ``mscheduler dev benchmarks.steady_state_app:app`` (the same consumer settings,
plan and limit, on its in-memory store) in a process of its own and sends the same load through
its REST API (``POST /api/v1/tasks`` batches); the probe there is a long-running task of the app
(``benchmarks/steady_state_app.py``) that writes its samples to a file.

The summary: RSS slope after ``--warmup`` (least squares, MB per 10 minutes), loop lag p99 and
p999 over every probe after the warm-up, the largest entries of each structure after the
warm-up against its value at the end of it, tasks sent, done and lost. ``--plot`` draws it
(matplotlib: ``pip install 'mscheduler[bench]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.common import machine

PROBE_INTERVAL = 0.05  # seconds the loop-lag probe sleeps
DRAIN_TIMEOUT = 300.0  # seconds the backlog may take to drain at the end
LIMITED_SHARE = 10  # one task in this many is of the limited name
LIMIT_MAX_RUNNING = 10
RETENTION_SECONDS = 5
PLAN_EVERY = timedelta(seconds=1)
EVENTS_KEPT = timedelta(minutes=1)  # the Mongo driver's event retention in the mongomock run


def rss_mb(pid: int | str = "self") -> float:
    """A process's resident set size now (``/proc/PID/statm``), in MB."""
    with open(f"/proc/{pid}/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (0.0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class LagProbe:
    """How late a ``PROBE_INTERVAL`` sleep wakes, again and again (seconds, per window)."""

    def __init__(self) -> None:
        self.window: list[float] = []

    async def run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(PROBE_INTERVAL)
            self.window.append(max(0.0, time.perf_counter() - start - PROBE_INTERVAL))

    def take(self) -> list[float]:
        window, self.window = self.window, []
        return window


def lag_fields(lags: list[float]) -> dict[str, float]:
    return {
        "lag_p50_ms": round(percentile(lags, 0.5) * 1000, 2),
        "lag_p99_ms": round(percentile(lags, 0.99) * 1000, 2),
        "lag_p999_ms": round(percentile(lags, 0.999) * 1000, 2),
        "lag_max_ms": round(max(lags, default=0.0) * 1000, 2),
        "probes": len(lags),
    }


@dataclass(slots=True)
class Outcomes:
    """Finished attempts by outcome, of the sent names (the plan's runs apart)."""

    by_outcome: dict[str, int] = field(default_factory=dict)
    planned: int = 0
    finished: int = 0
    target: int | None = None  # set ``reached`` once this many have finished
    reached: asyncio.Event = field(default_factory=asyncio.Event)

    def listener(self, event: str, data: dict[str, Any]) -> None:
        if event != "finished":
            return
        if data.get("name") == "planned":
            self.planned += 1
        elif data.get("name") in ("noop", "limited"):
            outcome = data["outcome"]
            self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1
            self.finished += 1
            if self.target is not None and self.finished >= self.target:
                self.reached.set()

    async def wait_for(self, target: int, timeout: float) -> None:
        """Until ``target`` attempts finished, or ``timeout`` seconds."""
        self.target = target
        if self.finished >= target:
            return
        try:
            await asyncio.wait_for(self.reached.wait(), timeout)
        except TimeoutError:
            return

    @property
    def succeeded(self) -> int:
        return self.by_outcome.get("succeeded", 0)


def batch_of(start: int, count: int) -> list[tuple[str, str]]:
    """(key, name) of the tasks ``start .. start + count``: every LIMITED_SHARE-th is limited."""
    return [(f"s-{i}", "limited" if i % LIMITED_SHARE == 0 else "noop") for i in range(start, start + count)]


async def send_at_rate(
    send: Callable[[list[tuple[str, str]]], Any], rate: float, batch: int, until: float, sent: list[int]
) -> None:
    """Send ``batch`` tasks every ``batch / rate`` seconds until ``until`` (monotonic); a batch
    that is late goes at once (the rate is kept on average). ``sent[0]``: tasks sent so far."""
    period = batch / rate
    due = time.monotonic()
    while due < until:
        await send(batch_of(sent[0], batch))
        sent[0] += batch
        due += period
        await asyncio.sleep(max(0.0, due - time.monotonic()))


def summary(samples: list[dict[str, Any]], lags: list[float], warmup: float) -> dict[str, Any]:
    """RSS slope (MB per 10 min) after the warm-up, lag percentiles of every probe after it,
    each structure's largest size after it against its size at its end."""
    after = [s for s in samples if s["t"] >= warmup]
    slope = None
    if len(after) >= 2:
        ts = [s["t"] for s in after]
        ys = [s["rss_mb"] for s in after]
        mean_t, mean_y = sum(ts) / len(ts), sum(ys) / len(ys)
        var = sum((t - mean_t) ** 2 for t in ts)
        slope = sum((t - mean_t) * (y - mean_y) for t, y in zip(ts, ys, strict=True)) / var * 600
    sizes: dict[str, dict[str, int]] = {}
    if after:
        for name in after[0]["sizes"]:
            values = [s["sizes"].get(name, 0) for s in after]
            sizes[name] = {"at_warmup": values[0], "max_after": max(values), "last": values[-1]}
    return {
        "rss_slope_mb_per_10min": None if slope is None else round(slope, 3),
        "rss_at_warmup_mb": after[0]["rss_mb"] if after else None,
        "rss_last_mb": samples[-1]["rss_mb"] if samples else None,
        **{k: v for k, v in lag_fields(lags).items()},
        "sizes": sizes,
    }


# -- in process: the memory driver, or the Mongo driver over mongomock ------------------------------


async def in_process(args: argparse.Namespace) -> dict[str, Any]:
    from mscheduler import (
        Consumer,
        EverySchedule,
        MemoryDriver,
        MongoDriver,
        Operations,
        Plan,
        PlanTiming,
        Publisher,
        Retention,
        Task,
    )
    from mscheduler.testing import mongomock_database

    kept = timedelta(seconds=RETENTION_SECONDS)
    driver: Any = (
        MemoryDriver(events=True)
        if args.driver == "memory"
        else MongoDriver(mongomock_database(), events=True, event_retention=EVENTS_KEPT)
    )
    await driver.setup()
    ops = Operations(driver)
    await ops.set_limit("limited", max_running=LIMIT_MAX_RUNNING)
    start_at = datetime.now(UTC)
    await ops.add_plan(
        Plan(
            plan_id="steady-tick",
            name="planned",
            timing=PlanTiming(schedule=EverySchedule(interval=PLAN_EVERY, start=start_at)),
        )
    )
    consumer = Consumer(
        driver,
        concurrency=30,
        retention=Retention(succeeded=kept, failed=kept, cancelled=kept, expired=kept),
        retention_interval=RETENTION_SECONDS,
    )

    async def noop() -> None:
        return None

    for name in ("noop", "limited", "planned"):
        consumer.register(name, noop)
    outcomes = Outcomes()
    consumer.add_listener(outcomes.listener)
    publisher = Publisher(driver)

    async def send(batch: list[tuple[str, str]]) -> None:
        await publisher.send_many([Task(key, name) for key, name in batch])

    async def stored() -> int:
        if args.driver == "memory":
            return int(driver.structure_sizes()["tasks"])
        return int(await driver.tasks.count_documents({}))

    def sizes() -> dict[str, int]:
        own = driver.structure_sizes() if args.driver == "memory" else {}
        return {
            **{f"store.{k}": v for k, v in own.items()},
            **{f"consumer.{k}": v for k, v in consumer.structure_sizes().items()},
        }

    probe = LagProbe()
    probing = asyncio.ensure_future(probe.run())
    ttl = asyncio.ensure_future(ttl_monitor(driver)) if args.driver == "mongomock" else None
    samples: list[dict[str, Any]] = []
    lags_after_warmup: list[float] = []
    sent = [0]
    begin = time.monotonic()
    await consumer.start()
    sending = asyncio.ensure_future(send_at_rate(send, args.rate, args.batch, begin + args.duration, sent))
    try:
        while not sending.done():
            await asyncio.wait(
                [sending], timeout=max(0.0, begin + (len(samples) + 1) * args.sample - time.monotonic())
            )
            lags = probe.take()
            t = time.monotonic() - begin
            if t >= args.warmup:
                lags_after_warmup += lags
            sample = {
                "t": round(t, 1),
                "rss_mb": round(rss_mb(), 1),
                **lag_fields(lags),
                "sent": sent[0],
                "done": outcomes.succeeded,
                "stored": await stored(),
                "sizes": sizes(),
            }
            samples.append(sample)
            print(json.dumps({k: v for k, v in sample.items() if k != "sizes"}), file=sys.stderr, flush=True)
        sending.result()
        await outcomes.wait_for(sent[0], DRAIN_TIMEOUT)
    finally:
        probing.cancel()
        if ttl is not None:
            ttl.cancel()
        await consumer.stop()
    return {
        "benchmark": "steady_state",
        "driver": args.driver,
        "rate": args.rate,
        "batch": args.batch,
        "duration": args.duration,
        "sent": sent[0],
        "succeeded": outcomes.succeeded,
        "outcomes": outcomes.by_outcome,
        "lost": sent[0] - outcomes.succeeded,
        "planned_runs": outcomes.planned,
        "summary": summary(samples, lags_after_warmup, args.warmup),
        "samples": samples,
    }


async def ttl_monitor(driver: Any) -> None:
    """What a real server's TTL monitor does to the event log (mongomock has none): every
    ``EVENTS_KEPT``, delete the events older than it, a thousand at a time."""
    while True:
        await asyncio.sleep(EVENTS_KEPT.total_seconds())
        before = datetime.now(UTC) - EVENTS_KEPT
        while True:
            old = [
                d["_id"] async for d in driver.events.find({"time": {"$lt": before}}, {"_id": 1}).limit(1000)
            ]
            if not old:
                break
            await driver.events.delete_many({"_id": {"$in": old}})


# -- `mscheduler dev` through its REST API ----------------------------------------------------------


def through_dev(args: argparse.Namespace) -> dict[str, Any]:
    """``mscheduler dev`` in a process of its own, the load through its REST API."""
    token = "steady-state-benchmark-token"
    workdir = Path(tempfile.mkdtemp(prefix="steady-dev-"))
    probe_file = workdir / "probe.jsonl"
    env = os.environ | {
        "STEADY_PROBE_FILE": str(probe_file),
        "STEADY_SAMPLE": str(args.sample),
        "STEADY_STOP_FILE": str(workdir / "stop"),
    }
    command = [sys.executable, "-m", "mscheduler", "dev", "benchmarks.steady_state_app:app"]
    with (workdir / "dev.log").open("w") as log:
        server = subprocess.Popen(
            [*command, "--port", str(args.port), "--token", token], env=env, stdout=log, stderr=log
        )
        try:
            sent = asyncio.run(load_dev(args, server, token, probe_file))
            (workdir / "stop").touch()
            time.sleep(args.sample + 1)  # the probe's last sample, then it returns
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
    samples = read_probe(probe_file)
    lags = [lag for s in samples if s["t"] >= args.warmup for lag in s["lags"]]
    for s in samples:
        del s["lags"]
    outcomes = samples[-1]["outcomes"] if samples else {}
    succeeded = outcomes.get("succeeded", 0)
    return {
        "benchmark": "steady_state",
        "driver": "mscheduler dev (REST API)",
        "rate": args.rate,
        "batch": args.batch,
        "duration": args.duration,
        "sent": sent,
        "succeeded": succeeded,
        "outcomes": outcomes,
        "lost": sent - succeeded,
        "summary": summary(samples, lags, args.warmup),
        "samples": samples,
    }


async def load_dev(args: argparse.Namespace, server: subprocess.Popen[bytes], token: str, probe: Path) -> int:
    """Set the limit, start the probe task, send at the rate, wait for the drain; tasks sent."""
    import httpx

    sent = [0]
    base = f"http://127.0.0.1:{args.port}/api/v1"
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        await wait_until_up(client, server)
        (await client.put("/limits/limited", json={"max_running": LIMIT_MAX_RUNNING})).raise_for_status()
        (await client.post("/tasks", json={"key": "steady-probe", "name": "probe"})).raise_for_status()
        for _ in range(600):  # the probe counts outcomes from its start: it starts first
            if await asyncio.to_thread(probe.exists):
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError("the probe task did not start within 30 s")

        async def send(batch: list[tuple[str, str]]) -> None:
            body = {"tasks": [{"key": key, "name": name} for key, name in batch]}
            (await client.post("/tasks", json=body)).raise_for_status()

        begin = time.monotonic()
        await send_at_rate(send, args.rate, args.batch, begin + args.duration, sent)
        drained_by = time.monotonic() + DRAIN_TIMEOUT
        while time.monotonic() < drained_by:
            last = await asyncio.to_thread(read_probe, probe)
            if last and sum(last[-1]["outcomes"].values()) >= sent[0]:
                break
            await asyncio.sleep(args.sample / 4)
    return sent[0]


async def wait_until_up(client: Any, server: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if server.poll() is not None:
            raise RuntimeError(f"mscheduler dev exited with {server.returncode}")
        try:
            if (await client.get("/health")).status_code < 500:
                return
        except Exception:  # not listening yet
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError("mscheduler dev did not answer within 30 s")


def read_probe(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the plot ---------------------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path, top: int = 8) -> None:
    """RSS, loop lag, and the ``top`` largest structures over time, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    minutes = [s["t"] / 60 for s in samples]
    fig, (rss, lag, sizes) = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    title = f"{result['driver']}: {result['rate']:g} tasks/s for {result['duration'] / 60:g} min"
    fig.suptitle(title)
    rss.plot(minutes, [s["rss_mb"] for s in samples], color="tab:blue")
    rss.set_ylabel("RSS (MB)")
    rss.set_ylim(bottom=0)
    for key, color in (("lag_p99_ms", "tab:orange"), ("lag_p999_ms", "tab:red")):
        lag.plot(minutes, [s[key] for s in samples], label=key.split("_")[1], color=color)
    lag.axhline(50, color="tab:orange", linestyle=":", linewidth=1)
    lag.axhline(200, color="tab:red", linestyle=":", linewidth=1)
    lag.set_ylabel("loop lag per 30 s (ms)")
    lag.legend(loc="upper right")
    names = sorted(samples[-1]["sizes"], key=lambda n: -max(s["sizes"].get(n, 0) for s in samples))[:top]
    for name in names:
        sizes.plot(minutes, [max(1, s["sizes"].get(name, 0)) for s in samples], label=name)
    sizes.plot(
        minutes, [max(1, s["stored"]) for s in samples], label="stored tasks", color="black", linestyle="--"
    )
    sizes.set_yscale("log")
    sizes.set_ylabel("entries")
    sizes.set_xlabel("minutes")
    sizes.legend(loc="upper left", fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=("memory", "mongomock"), default="memory")
    parser.add_argument("--dev", action="store_true", help="mscheduler dev through its REST API")
    parser.add_argument("--port", type=int, default=8731)
    parser.add_argument("--rate", type=float, default=1500.0, help="tasks sent a second")
    parser.add_argument("--batch", type=int, default=150, help="tasks per send")
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds of sending")
    parser.add_argument("--warmup", type=float, default=300.0, help="seconds before the slope is measured")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="write the whole result (every sample) here")
    parser.add_argument("--plot", type=Path, help="draw the samples into this PNG")
    args = parser.parse_args()
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    result = through_dev(args) if args.dev else asyncio.run(in_process(args))
    result |= {
        "started": started.isoformat(timespec="seconds"),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "machine": machine(),
    }
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot is not None:
        plot(result, args.plot)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}), flush=True)


if __name__ == "__main__":
    main()
