"""``make demo`` on a fresh clone, as a new user runs it: clone, ``make demo`` (which creates the
venv, installs what the demo needs and runs it), the commits given in turn (A B A B ...).

Each run clones this repository into a new temporary directory, checks out the commit and times
``make demo`` from its start to its exit (wall clock), with the children's CPU time and the size
of the venv it left. pip's download cache is the user's own (warm after the first round, which is
not counted: the figure is then the install's own time, not the network's); ``--cold`` gives each
run an empty cache instead (every package downloaded).

    python -m benchmarks.fresh_clone --ref base=4dad86a --ref now=HEAD --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_ref(text: str) -> tuple[str, str]:
    name, sep, ref = text.partition("=")
    if not sep or not name or not ref:
        raise argparse.ArgumentTypeError(f"--ref takes NAME=COMMIT, got {text!r}")
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=REPO, capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise argparse.ArgumentTypeError(f"{ref!r} is no commit of {REPO}")
    return name, commit.stdout.strip()


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def one_run(commit: str, cold: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fresh-clone-") as tmp:
        clone = Path(tmp) / "mscheduler"
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        if cold:
            env["PIP_CACHE_DIR"] = str(Path(tmp) / "pip-cache")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise SystemExit(f"make demo at {commit[:7]} exited {done.returncode}:\n{done.stderr[-2000:]}")
        return {"wall": wall, "cpu": cpu, "venv_bytes": du(clone / ".venv")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", type=parse_ref, action="append", required=True, metavar="NAME=COMMIT")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="an empty pip cache for every run")
    parser.add_argument("--json", type=Path, help="also write every run here")
    args = parser.parse_args(argv)
    refs: list[tuple[str, str]] = args.ref
    if not args.cold:
        for _, commit in refs:  # the warm-up round: fills pip's cache
            one_run(commit, cold=False)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in refs}
    for _ in range(args.rounds):
        for name, commit in refs:
            runs[name].append(one_run(commit, args.cold))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {args.rounds} rounds, alternating")
    header = ("ref", "commit", "wall median", "min", "max", "cpu median", "venv MB")
    print("{:<8} {:<8} {:>12} {:>8} {:>8} {:>11} {:>8}".format(*header))
    for name, commit in refs:
        walls = [r["wall"] for r in runs[name]]
        cpu = statistics.median(r["cpu"] for r in runs[name])
        size = statistics.median(r["venv_bytes"] for r in runs[name]) / 1e6
        median = statistics.median(walls)
        spread = f"{min(walls):>7.1f}s {max(walls):>7.1f}s"
        print(f"{name:<8} {commit[:7]:<8} {median:>11.1f}s {spread} {cpu:>10.1f}s {size:>8.0f}")
    if args.json is not None:
        args.json.write_text(
            json.dumps({name: {"commit": c, "runs": runs[name]} for name, c in refs}, indent=1)
        )


if __name__ == "__main__":
    main()
