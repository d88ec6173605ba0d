"""Run every benchmark in fresh processes and print the figures against the issue's targets.

Cheap benchmarks run ``--runs`` times (default 3) and report the median run; the mongomock
command count and the 100,000-task burn-down run once. Nothing here fails on a missed target:
a benchmark measures, it does not assert. The exit code is non-zero only if a benchmark crashed.

    python -m benchmarks.run_all [--runs 3] [--quick] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.common import machine


@dataclass(frozen=True, slots=True)
class Spec:
    title: str
    module: str
    args: tuple[str, ...]
    runs: int  # 0: use --runs
    metric: str  # the field compared with the target
    target: float
    higher_is_better: bool
    unit: str


def specs(quick: bool) -> list[Spec]:
    tasks = "2000" if quick else "10000"
    return [
        Spec(
            "1. burn-down, MemoryDriver, concurrency 30",
            "burn_down",
            ("--tasks", tasks, "--concurrency", "30"),
            0,
            "tasks_per_s",
            10_000,
            True,
            "tasks/s",
        ),
        Spec(
            "2. burn-down, 1 ms round trip per driver call, concurrency 30",
            "burn_down_latency",
            ("--tasks", tasks, "--concurrency", "30", "--rtt-ms", "1"),
            0,
            "tasks_per_s",
            10_000,
            True,
            "tasks/s",
        ),
        Spec(
            "3. storage commands per task, MongoDriver on mongomock, sends of 100 (backlog)",
            "commands_per_task",
            ("--tasks", "300" if quick else "1000", "--mode", "backlog"),
            1,
            "per_task_commands_per_task",
            1.2,
            False,
            "commands/task",
        ),
        Spec(
            "3b. the same, trickle (each batch of 100 sent when the last one is done)",
            "commands_per_task",
            ("--tasks", "300" if quick else "500", "--mode", "trickle"),
            1,
            "per_task_commands_per_task",
            1.2,
            False,
            "commands/task",
        ),
        Spec(
            "4. publish → handler start, idle consumer, MemoryDriver (p50)",
            "publish_latency",
            ("--sends", "1000" if quick else "2000"),
            0,
            "p50_ms",
            2.0,
            False,
            "ms",
        ),
        Spec(
            "1m. burn-down memory: peak Python allocations (tracemalloc)",
            "burn_down",
            ("--tasks", tasks, "--concurrency", "30", "--tracemalloc"),
            1,
            "tracemalloc_peak_mib",
            0,
            False,
            "MiB",
        ),
        Spec(
            "5. documents examined per claim, 100,000 tasks aimed at an absent worker + 1,000 free",
            "claim_examined",
            ("--targeted", "20000" if quick else "100000", "--free", "1000"),
            1,
            "examined_per_claim",
            1.0,
            False,
            "docs/claim",
        ),
        Spec(
            "6. 10,000 plans due at once, MemoryDriver: commands per occurrence beyond its insert",
            "plans_due",
            ("--plans", "2000" if quick else "10000", "--driver", "memory"),
            1,
            "commands_per_occurrence_beyond_insert",
            0.05,
            False,
            "commands/occurrence",
        ),
        Spec(
            "6m. the same, MongoDriver on mongomock (2,000 plans: mongomock scans; count only)",
            "plans_due",
            ("--plans", "500" if quick else "2000", "--driver", "mongomock"),
            1,
            "commands_per_occurrence_beyond_insert",
            0.05,
            False,
            "commands/occurrence",
        ),
        Spec(
            "7. workflow step cost: a map step's item, CPU per step / a plain task's",
            "workflow_steps",
            ("--steps", "2000" if quick else "10000", "--rounds", "3"),
            1,
            "map_cpu_ratio",
            1.5,
            False,
            "x plain",
        ),
        Spec(
            "7b. the same, a chain of 5 steps each needing the one before",
            "workflow_steps",
            ("--steps", "2000" if quick else "10000", "--rounds", "3"),
            1,
            "chain_cpu_ratio",
            1.5,
            False,
            "x plain",
        ),
        Spec(
            "1x. burn-down of 100,000 tasks, MemoryDriver, concurrency 30",
            "burn_down",
            ("--tasks", "20000" if quick else "100000", "--concurrency", "30"),
            1,
            "tasks_per_s",
            10_000,
            True,
            "tasks/s",
        ),
    ]


def run_once(spec: Spec) -> dict[str, Any]:
    command = [sys.executable, "-m", f"benchmarks.{spec.module}", *spec.args]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def verdict(spec: Spec, value: float) -> str:
    if spec.target == 0:
        return "(reported)"
    ok = value >= spec.target if spec.higher_is_better else value <= spec.target
    return "PASS" if ok else "MISS"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each cheap benchmark (median reported)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--json", help="also write every run's result to this file")
    args = parser.parse_args()

    info = machine()
    print(f"# mscheduler benchmarks — {info['date']}")
    print(f"machine: {info['nproc']} CPUs, {info['cpu']}; Python {info['python']}; {info['platform']}")
    print(f"load average at start: {info['loadavg']}\n")
    everything: list[dict[str, Any]] = []
    rows = []
    for spec in specs(args.quick):
        runs = spec.runs or args.runs
        started = time.monotonic()
        results = [run_once(spec) for _ in range(runs)]
        values = [float(r[spec.metric]) for r in results]
        median = statistics.median(values)
        # the run whose figure is the median, for its other fields
        chosen = min(results, key=lambda r: abs(float(r[spec.metric]) - median))
        everything.extend({"title": spec.title, **r} for r in results)
        target = "—" if spec.target == 0 else f"{'≥' if spec.higher_is_better else '≤'} {spec.target:g}"
        figure = f"{median:,.3f}" if median < 100 else f"{median:,.0f}"
        rows.append((spec.title, target, f"{figure} {spec.unit}", verdict(spec, median), runs))
        spread = ", ".join(f"{v:,.3f}" if v < 100 else f"{v:,.0f}" for v in values)
        print(
            f"{spec.title}: {figure} {spec.unit} [{verdict(spec, median)}] runs: {spread}"
            f" ({time.monotonic() - started:.0f}s)"
        )
        extra = {k: v for k, v in chosen.items() if k not in {"benchmark", spec.metric}}
        print(f"    {json.dumps(extra)}")
    print("\n| benchmark | target | measured (median) | verdict | runs |")
    print("|---|---|---|---|---|")
    for title, target, figure, result, runs in rows:
        print(f"| {title} | {target} | {figure} | {result} | {runs} |")
    print(f"\nload average at end: {machine()['loadavg']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "runs": everything}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
