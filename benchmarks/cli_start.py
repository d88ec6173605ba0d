"""The command line's start: ``mscheduler --version`` and ``mscheduler --help`` as whole
processes, each build in turn (A B A B ...), so a machine that speeds up or slows down during the
run moves both alike.

Each run is ``python -m mscheduler ARGS`` in a fresh interpreter with ``PYTHONPATH=DIR`` (the
build's checkout first on the path, as ``compare`` does), timed from the start of the process to
its exit (wall clock), with the child's own CPU time (user + system, from ``wait4``). Printed per
build and command: the median and the spread of ``--runs`` runs, and the median of the per-pair
ratios to the first build.

    python -m benchmarks.cli_start --build base=/tmp/base --build now=. --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.compare import Build, parse_build

COMMANDS = {"--version": ["--version"], "--help": ["--help"]}


def one_run(build: Build, args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``python -m mscheduler ARGS`` on ``build``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(build.directory)}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mscheduler", *args],
        cwd=build.directory,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{build.name}: mscheduler {' '.join(args)} exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=parse_build, action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--runs", type=int, default=20, help="runs of each command per build")
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args(argv)
    builds: list[Build] = args.build
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for build in builds:  # a warm-up each: the file cache, compiled bytecode
        for command in COMMANDS.values():
            one_run(build, command)
    for _ in range(args.runs):
        for name, command in COMMANDS.items():
            for build in builds:
                runs.setdefault((build.name, name), []).append(one_run(build, command))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {args.runs} runs each, alternating")
    header = ("build", "command", "wall median", "min", "max", "cpu median", "ratio")
    print("{:<10} {:<10} {:>12} {:>7} {:>7} {:>11} {:>6}".format(*header))
    report: dict[str, Any] = {}
    for name in COMMANDS:
        first = runs[(builds[0].name, name)]
        for build in builds:
            mine = runs[(build.name, name)]
            walls = [w for w, _ in mine]
            ratio = statistics.median(a[0] / b[0] for a, b in zip(mine, first, strict=True))
            cpu = statistics.median(c for _, c in mine)
            print(
                f"{build.name:<10} {name:<10} {statistics.median(walls):>11.3f}s {min(walls):>6.3f}s "
                f"{max(walls):>6.3f}s {cpu:>10.3f}s {ratio:>6.2f}"
            )
            report[f"{build.name} {name}"] = {"runs": mine, "ratio_to_first": ratio}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
