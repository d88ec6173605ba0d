"""huey's in-memory queue on the same figures as ``bench_scenarios.py``: a yardstick, one JSON line.

``MemoryHuey(immediate=False)`` with its own consumer in this process, 10,000 no-op tasks by
default. Scenarios: ``huey_memory_burn_down`` (enqueue first, not timed; then the consumer runs
them: tasks/s from the first task executing to the last one complete, as mscheduler's burn-down
counts from the first claim to the last success), ``huey_memory_enqueue`` (one ``noop()`` call
per task, the counterpart of ``send``) and ``huey_memory_map`` (``noop.map(...)``, huey's bulk
call and the counterpart of ``send_many``; it enqueues one task at a time: MemoryStorage has no
batch insert).

Settings for huey's best in-process figure, measured on the 2-core VM (10,000 tasks, 6
alternating runs each): ONE worker thread (burn-down median 91,000 tasks/s, runs 74,000-97,000;
2 threads 20,000-80,000, median 74,000; 4 threads 72,000-95,000, median 90,000: threads only add
GIL hand-offs to no-op tasks), no periodic scheduler pass, no health checks, ``results=False``
(a no-op's None is not stored either way; ``--results`` made no difference beyond the noise on
enqueues). Process workers cannot share a MemoryHuey (each fork has its own memory) and
greenlets need gevent (not installed, and no help to CPU-only tasks).

    python benchmarks/huey_bench.py SCENARIO [--tasks 10000] [--workers 1] [--results]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from typing import Any

SCENARIOS = ("huey_memory_burn_down", "huey_memory_enqueue", "huey_memory_map")


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(scenario: str, tasks: int, workers: int, results: bool, timeout: float) -> dict[str, Any]:
    """Run one scenario; huey missing is a skip, not an error (it is no dependency of mscheduler)."""
    result: dict[str, Any] = {"scenario": scenario, "tasks": tasks}
    try:
        import huey
        from huey import MemoryHuey
        from huey.signals import SIGNAL_COMPLETE, SIGNAL_EXECUTING
    except ImportError:
        result["skipped"] = "huey is not installed (pip install huey)"
        return result

    queue = MemoryHuey("bench", immediate=False, results=results)

    @queue.task()
    def noop() -> None:
        return None

    if scenario == "huey_memory_enqueue":
        started = time.perf_counter()
        for _ in range(tasks):
            noop()
        seconds = time.perf_counter() - started
    elif scenario == "huey_memory_map":
        started = time.perf_counter()
        noop.map(range(tasks))
        seconds = time.perf_counter() - started
    else:
        for _ in range(tasks):
            noop()
        first: list[float] = []
        finished: list[float] = []  # list.append is atomic: worker threads record without a lock
        done = threading.Event()

        @queue.signal(SIGNAL_EXECUTING)
        def executing(signal: str, task: Any) -> None:
            if not first:
                first.append(time.perf_counter())

        @queue.signal(SIGNAL_COMPLETE)
        def complete(signal: str, task: Any) -> None:
            finished.append(time.perf_counter())
            if len(finished) >= tasks:
                done.set()

        consumer = queue.create_consumer(
            workers=workers, worker_type="thread", periodic=False, check_worker_health=False
        )
        consumer.start()
        try:
            if not done.wait(timeout):
                raise RuntimeError(f"only {len(finished)} of {tasks} tasks completed in {timeout} s")
        finally:
            consumer.stop(graceful=True)
        seconds = max(finished) - first[0]
    result.update(
        {
            "tasks_per_s": round(tasks / seconds),
            "seconds": round(seconds, 3),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "huey_version": huey.__version__,
            "workers": workers,
            "worker_type": "thread",
            "results": results,
            "python": sys.version.split()[0],
        }
    )
    return result


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=1, help="worker threads (1 is huey's best here)")
    parser.add_argument("--results", action="store_true", help="MemoryHuey(results=True)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the burn-down")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.scenario, args.tasks, args.workers, args.results, args.timeout)), flush=True)


if __name__ == "__main__":
    cli()
