"""Compare builds of mscheduler back to back: the same scenario script, a different package each.

The VM's speed drifts by ±25 % over minutes, so builds are never measured one after the other:
each round runs every scenario once per build, alternating (round 1: A, B, huey; round 2: A, B,
huey; ...), and the table gives each build's median / min / max tasks/s and its ratio to the
first build IN THE SAME ROUND (the median of those ratios is the figure to quote; in a scenario
the first build skips, the first build that ran it is the reference). Every run is
a fresh process running ``benchmarks/bench_scenarios.py`` from THIS checkout with
``PYTHONPATH=<build dir>``, so only the ``mscheduler`` package differs between builds; each run
checks that ``mscheduler`` was imported from its build's directory.

    python -m benchmarks.compare                       # one build: current=. (this checkout)
    python -m benchmarks.compare --build core=/work/build-core --build today=/work/build-today --build now=.
    python -m benchmarks.compare --build a=DIR --build b=DIR --huey --rounds 3 --scenarios burn_down,send
                                 [--tasks 10000] [--timeout 300] [--json results.json]

A build is ``NAME=DIR``, DIR a checkout (worktree) whose ``mscheduler/`` is imported, e.g. one
made by ``git worktree add --detach /work/build-core d2dc2c2``. ``--huey`` adds huey's MemoryHuey
(``benchmarks/huey_bench.py``, needs ``pip install huey``) to the scenarios it has a counterpart
for: ``burn_down``, ``send`` (one enqueue per call) and ``send_many`` (``map``). Scenarios a build
lacks the features for are reported as skipped. Each run has a timeout; a run that fails or times
out is reported under its table and the others still count; Ctrl-C prints what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCENARIO_SCRIPT = HERE / "bench_scenarios.py"
HUEY_SCRIPT = HERE / "huey_bench.py"
SCENARIOS = (
    "burn_down",
    "burn_down_rtt",
    "send_many",
    "send",
    "burn_down_events",
    "burn_down_limit",
    "burn_down_plans",
    "burn_down_children",
    "burn_down_fair",
)
HUEY_COUNTERPARTS = {
    "burn_down": "huey_memory_burn_down",
    "send": "huey_memory_enqueue",
    "send_many": "huey_memory_map",
}
HUEY = "huey"


@dataclass(frozen=True, slots=True)
class Build:
    """A name for the table and the checkout whose ``mscheduler`` package a run imports."""

    name: str
    directory: Path


@dataclass(slots=True)
class Run:
    """One subprocess: its JSON line (``result``) or why there is none (``error``)."""

    round: int
    scenario: str
    build: str
    result: dict[str, Any] | None = None
    error: str | None = None
    wall_seconds: float = 0.0

    @property
    def tasks_per_s(self) -> float | None:
        if self.result is None or "skipped" in self.result:
            return None
        value = self.result.get("tasks_per_s")
        return float(value) if value is not None else None


def parse_build(text: str) -> Build:
    """``NAME=DIR`` → a build; DIR must hold an ``mscheduler`` package."""
    name, sep, directory = text.partition("=")
    if not sep or not name or not directory:
        raise argparse.ArgumentTypeError(f"--build takes NAME=DIR, got {text!r}")
    path = Path(directory).expanduser().resolve()
    if not (path / "mscheduler" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{path} has no mscheduler/__init__.py")
    return Build(name, path)


def run_script(
    script: Path, scenario: str, tasks: int, timeout: float, pythonpath: Path | None
) -> tuple[dict[str, Any] | None, str | None]:
    """Run ``script scenario`` in a fresh interpreter; its last stdout line is the JSON result."""
    args = [str(script), scenario, "--tasks", str(tasks), "--timeout", str(timeout)]
    return run_command(args, timeout, pythonpath)


def run_command(
    args: Sequence[str], timeout: float, pythonpath: Path | None
) -> tuple[dict[str, Any] | None, str | None]:
    """``python ARGS`` in a fresh interpreter (``PYTHONPATH`` only ``pythonpath``); its last
    stdout line that starts with ``{`` is the JSON result, else the error."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    command = [sys.executable, *args]
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g} s"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return None, f"exit {proc.returncode}: {tail or 'no output'}"
    try:
        return json.loads(lines[-1]), None
    except json.JSONDecodeError as exc:
        return None, f"bad JSON line ({exc}): {lines[-1][:200]}"


def run_build(
    build: Build, scenario: str, tasks: int, timeout: float
) -> tuple[dict[str, Any] | None, str | None]:
    """One scenario on one build, refusing a run that imported mscheduler from elsewhere."""
    args = [str(SCENARIO_SCRIPT), scenario, "--tasks", str(tasks), "--timeout", str(timeout)]
    return run_in_build(args, build.directory, timeout)


def run_in_build(
    args: Sequence[str], directory: Path, timeout: float
) -> tuple[dict[str, Any] | None, str | None]:
    """``run_command`` with ``mscheduler`` from ``directory``: a result whose ``mscheduler_file``
    lies elsewhere is refused (the build was not the one measured)."""
    result, error = run_command(args, timeout, directory)
    if result is not None:
        imported = Path(result.get("mscheduler_file", "")).resolve()
        if not imported.is_relative_to(directory):
            return None, f"imported mscheduler from {imported}, not from {directory}"
    return result, error


def machine_facts() -> dict[str, Any]:
    """What the figures depend on: the VM, its load, the interpreter, the time."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def summarise(runs: Sequence[Run], scenarios: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
    """Per scenario and build: median / min / max tasks/s and per-round ratios to the reference.

    The reference is the first build, or for a scenario it skipped (a feature it lacks) the first
    build that measured it: ``reference`` in each scenario's entry says which.
    """
    summary: dict[str, Any] = {}
    for scenario in scenarios:
        mine_by_name = {
            name: [r for r in runs if r.scenario == scenario and r.build == name] for name in names
        }
        measured = [n for n in names if n != HUEY and any(r.tasks_per_s for r in mine_by_name[n])]
        reference = measured[0] if measured else None
        base = {r.round: r.tasks_per_s for r in mine_by_name.get(reference or "", [])}
        rows: dict[str, Any] = {}
        for name, mine in mine_by_name.items():
            if mine:
                rows[name] = _row(scenario, mine, base)
        summary[scenario] = {"reference": reference, "builds": rows}
    return summary


def _row(scenario: str, mine: Sequence[Run], base: dict[int, float | None]) -> dict[str, Any]:
    values = [v for r in mine if (v := r.tasks_per_s) is not None]
    ratios = [
        round(v / b, 3)
        for r in mine
        if (v := r.tasks_per_s) is not None and (b := base.get(r.round)) is not None and b > 0
    ]
    results = [r.result for r in mine if r.result is not None]
    skipped = sorted({res["skipped"] for res in results if "skipped" in res})
    rss = [res["peak_rss_mib"] for res in results if "peak_rss_mib" in res]
    commands = [res["commands_per_task"] for res in results if "commands_per_task" in res]
    return {
        "scenario": results[0].get("scenario", scenario) if results else scenario,
        "runs": len(values),
        "tasks_per_s": values,
        "median": statistics.median(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "ratios": ratios,
        "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
        "peak_rss_mib": statistics.median(rss) if rss else None,
        "commands_per_task": statistics.median(commands) if commands else None,
        "skipped": skipped[0] if skipped else None,
        "errors": [f"round {r.round}: {r.error}" for r in mine if r.error],
    }


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def format_tables(summary: dict[str, Any], tasks: int) -> str:
    """One plain-text table per scenario, as the module docstring describes."""
    out: list[str] = []
    header = (
        f"{'build':<10} {'runs':>4} {'median':>9} {'min':>9} {'max':>9} {'ratio':>6}  {'RSS MiB':>7}"
        "  per-round ratio"
    )
    for scenario, entry in summary.items():
        reference = entry["reference"] or "-"
        out.append(f"{scenario} ({tasks:,} tasks; tasks/s; ratio = build / {reference} in the same round)")
        out.append(header)
        notes: list[str] = []
        for name, row in entry["builds"].items():
            label = name if row["scenario"] == scenario else f"{name}*"
            if row["skipped"] and not row["runs"]:
                out.append(f"{label:<10} skipped: {row['skipped']}")
            else:
                ratio = "-" if row["median_ratio"] is None else f"{row['median_ratio']:.3f}"
                rss = "-" if row["peak_rss_mib"] is None else f"{row['peak_rss_mib']:.1f}"
                per_round = " ".join(f"{r:.3f}" for r in row["ratios"])
                line = (
                    f"{label:<10} {row['runs']:>4} {_num(row['median']):>9} {_num(row['min']):>9} "
                    f"{_num(row['max']):>9} {ratio:>6}  {rss:>7}  {per_round}"
                )
                out.append(line.rstrip())
            if row["commands_per_task"] is not None:
                notes.append(
                    f"  {name}: {row['commands_per_task']} driver requests per task (the consumer's)"
                )
            if label != name:
                notes.append(f"  {label} = {row['scenario']}")
            notes.extend(f"  {name} FAILED {error}" for error in row["errors"])
        out.extend(notes)
        out.append("")
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--build", action="append", type=parse_build, metavar="NAME=DIR", default=[])
    parser.add_argument(
        "--huey", action="store_true", help="also run huey's MemoryHuey where it has a counterpart"
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: all)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write every run here")
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    if not args.build:
        args.build = [parse_build("current=.")]
    names = [b.name for b in args.build]
    if len(set(names)) != len(names) or HUEY in names:
        parser.error(f"build names must be distinct and not {HUEY!r}: {names}")
    if args.rounds < 1 or args.tasks < 1:
        parser.error("--rounds and --tasks must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every round, print the tables (also after a failure or Ctrl-C); 1 if a run failed."""
    args = parse_args(argv)
    builds: list[Build] = args.build
    names = [b.name for b in builds]
    if args.huey:
        names.append(HUEY)
    started = machine_facts()
    print(f"# {started['date']}  nproc {started['nproc']}  load {started['loadavg']}  {started['cpu']}")
    for build in builds:
        print(f"# {build.name} = {build.directory}")
    runs: list[Run] = []
    interrupted = False
    try:
        for round_no in range(1, args.rounds + 1):
            for scenario in args.scenarios:
                for build in builds:
                    t0 = time.perf_counter()
                    result, error = run_build(build, scenario, args.tasks, args.timeout)
                    runs.append(Run(round_no, scenario, build.name, result, error, time.perf_counter() - t0))
                    _progress(runs[-1], args.rounds)
                if args.huey and scenario in HUEY_COUNTERPARTS:
                    t0 = time.perf_counter()
                    result, error = run_script(
                        HUEY_SCRIPT, HUEY_COUNTERPARTS[scenario], args.tasks, args.timeout, None
                    )
                    runs.append(Run(round_no, scenario, HUEY, result, error, time.perf_counter() - t0))
                    _progress(runs[-1], args.rounds)
    except KeyboardInterrupt:
        interrupted = True
        print("# interrupted: partial results", file=sys.stderr)
    summary = summarise(runs, args.scenarios, names)
    ended = machine_facts()
    print()
    print(format_tables(summary, args.tasks), end="")
    print(f"# load average at start {started['loadavg']}, at end {ended['loadavg']}; {len(runs)} runs")
    if args.json is not None:
        record = {
            "machine": started,
            "load_at_end": ended["loadavg"],
            "builds": {b.name: str(b.directory) for b in builds},
            "tasks": args.tasks,
            "rounds": args.rounds,
            "interrupted": interrupted,
            "summary": summary,
            "runs": [asdict(r) for r in runs],
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    failed = any(r.error for r in runs)
    return 1 if failed or interrupted else 0


def _progress(run: Run, rounds: int) -> None:
    if run.error:
        what = f"FAILED {run.error}"
    elif run.result and "skipped" in run.result:
        what = f"skipped: {run.result['skipped']}"
    else:
        what = f"{run.tasks_per_s:,.0f} tasks/s"
    print(
        f"[{run.round}/{rounds}] {run.scenario:<20} {run.build:<10} {what} ({run.wall_seconds:.1f} s)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
