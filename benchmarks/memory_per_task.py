"""Memory per queued task and per running task (issue 21, item 4), MemoryDriver, one JSON line.

Self-contained like ``bench_scenarios.py`` (stdlib and mscheduler's public API), so that the same
script measures any build put first on ``PYTHONPATH``; ``--build NAME=DIR`` runs each build in a
fresh process, alternating, as ``compare`` does.

* ``queued``: 100,000 no-op tasks published with ``Publisher.send_many`` (batches of 1,000, each
  batch's ``Task`` objects made just before it is sent and dropped after). Reported: the bytes
  the store keeps per task once publishing is over (tracemalloc, after a full collection:
  ``retained_bytes_per_task``), the peak while publishing (``peak_bytes_per_task``: the store plus
  one batch in flight), and in a second process without tracemalloc, the growth of the peak RSS
  (``rss_bytes_per_task``: what the OS saw, allocator overhead and fragmentation included).
* ``running``: 1,000 tasks published, then one consumer (concurrency 1,000) claims them all and
  each handler waits on one event: the bytes more than with those tasks queued
  (``bytes_per_running_task``: the attempt entry, the consumer's runner, its asyncio task, its
  lease bookkeeping), measured once every handler has started; then the handlers are released.

    PYTHONPATH=/path/to/build python benchmarks/memory_per_task.py queued|queued_rss|running [--tasks N]
    python -m benchmarks.memory_per_task --build start=/work/build-start-21 --build now=. --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import resource
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

QUEUED_TASKS = 100_000
RUNNING_TASKS = 1_000
BATCH = 1000
TASK_NAME = "noop"
MODES = ("queued", "queued_rss", "running")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


async def publish(driver: Any, count: int, prefix: str = "task") -> None:
    from mscheduler import Publisher, Task

    publisher = Publisher(driver)
    for start in range(0, count, BATCH):
        batch = [Task(f"{prefix}-{i}", TASK_NAME) for i in range(start, min(start + BATCH, count))]
        await publisher.send_many(batch)
        del batch


async def queued(count: int, trace: bool) -> dict[str, Any]:
    from mscheduler import MemoryDriver

    driver = MemoryDriver()
    await publish(driver, min(count, BATCH), prefix="warm-up")  # imports, caches: not counted
    driver = MemoryDriver()
    gc.collect()
    if trace:
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
    rss_before = peak_rss_bytes()
    started = time.perf_counter()
    await publish(driver, count)
    seconds = time.perf_counter() - started
    gc.collect()
    out: dict[str, Any] = {"tasks": count, "seconds": round(seconds, 3)}
    if trace:
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["retained_bytes_per_task"] = round((current - before) / count)
        out["peak_bytes_per_task"] = round((peak - before) / count)
    else:
        out["rss_bytes_per_task"] = round((peak_rss_bytes() - rss_before) / count)
        out["peak_rss_mib"] = round(peak_rss_bytes() / 2**20, 1)
    assert await driver.get_task("task-0") is not None  # the store is still there
    return out


async def running(count: int) -> dict[str, Any]:
    from mscheduler import Consumer, MemoryDriver

    driver = MemoryDriver()
    await publish(driver, count)
    release = asyncio.Event()
    started = 0
    all_started = asyncio.Event()

    async def handler() -> None:
        nonlocal started
        started += 1
        if started == count:
            all_started.set()
        await release.wait()

    consumer = Consumer(driver, concurrency=count)
    consumer.register(TASK_NAME, handler)
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    async with consumer:
        await asyncio.wait_for(all_started.wait(), timeout=120)
        await asyncio.sleep(0.05)  # the claims' bookkeeping settles
        gc.collect()
        current, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        release.set()
    return {"tasks": count, "bytes_per_running_task": round((current - before) / count)}


def run_one(mode: str, tasks: int | None) -> dict[str, Any]:
    import mscheduler

    logging.disable(logging.WARNING)  # "no live worker handles ..." while publishing
    if mode == "queued":
        result = asyncio.run(queued(tasks or QUEUED_TASKS, trace=True))
    elif mode == "queued_rss":
        result = asyncio.run(queued(tasks or QUEUED_TASKS, trace=False))
    else:
        result = asyncio.run(running(tasks or RUNNING_TASKS))
    return {"mode": mode, "mscheduler_file": mscheduler.__file__, **result}


def compare(builds: list[tuple[str, Path]], rounds: int, tasks: int | None) -> None:
    """Each mode, each build, alternating, in fresh processes; medians per build."""
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    from benchmarks.compare import run_in_build  # the parent only (a run is this file as a script)

    for round_no in range(1, rounds + 1):
        for mode in MODES:
            for name, directory in builds:
                args = [str(Path(__file__).resolve()), mode]
                if tasks is not None:
                    args += ["--tasks", str(tasks)]
                result, error = run_in_build(args, directory, 900)
                if result is None:
                    print(f"[{round_no}] {mode} {name}: failed: {error}")
                    continue
                results.setdefault((mode, name), []).append(result)
                print(f"[{round_no}] {mode:<11} {name:<8} {json.dumps(result)}", flush=True)
    fields = {
        "queued": ("retained_bytes_per_task", "peak_bytes_per_task"),
        "queued_rss": ("rss_bytes_per_task",),
        "running": ("bytes_per_running_task",),
    }
    print()
    print("| mode | figure | " + " | ".join(name for name, _ in builds) + " |")
    print("|---|---|" + "---|" * len(builds))
    for mode in MODES:
        for field in fields[mode]:
            cells = []
            for name, _ in builds:
                values = [r[field] for r in results.get((mode, name), [])]
                cells.append(
                    f"{statistics.median(values):,.0f} ({', '.join(map(str, values))})" if values else "-"
                )
            print(f"| {mode} | {field} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", choices=MODES)
    parser.add_argument("--tasks", type=int)
    parser.add_argument("--build", action="append", default=[], help="NAME=DIR (compare builds)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.build:
        from benchmarks.compare import parse_build  # the parent only (a run is this file as a script)

        try:
            builds = [(b.name, b.directory) for b in map(parse_build, args.build)]
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
        compare(builds, args.rounds, args.tasks)
        return
    if args.mode is None:
        parser.error("give a mode, or --build NAME=DIR to compare builds")
    print(json.dumps(run_one(args.mode, args.tasks)))


if __name__ == "__main__":
    main()
