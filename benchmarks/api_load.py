"""The REST API under a mixed load (issue 20): builds side by side, loopback only, bounded.

The probe's mix, for ``--seconds`` (30) against a server over a MemoryDriver with ``--tasks``
(5,000) pending tasks and the event log on (``api_load_server.py``, a fresh process per run with
``PYTHONPATH=<build>``):

* 12 readers, each in a loop: ``GET /tasks?limit=100``, ``/stats``, ``/tasks?status=pending&
  limit=100``, ``/tasks/{key}``, ``/workers``, ``/whoami``;
* 4 executors: ``POST /executors/lease`` (up to 5 tasks, waiting up to 1 s), then a ``report``
  (succeeded) for each task leased;
* 4 event-stream clients reconnecting, each with its own read token: each reads
  ``/events/stream`` for 2 s, closes it and opens it again (with ``Last-Event-ID``).

Measured: requests/s (readers' and executors' requests that completed, stream openings not
counted), p50 / p99 latency of those requests (a lease that waited is measured too: its wait is
at most 1 s), and the server process's CPU (user + system time over the run, from
``/proc/<pid>/stat``, as a share of one core). The client runs in this process, on the same
machine: both share its cores.

    python -m benchmarks.api_load                                    # this checkout
    python -m benchmarks.api_load --build before=/work/build-shape --build after=. --rounds 3
                                  [--seconds 30] [--tasks 5000] [--json results.json]

Builds alternate round by round (A B, A B, ...); the table gives each build's median over its
rounds and every round's figures. Nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.compare import Build, machine_facts, parse_build

HERE = Path(__file__).resolve().parent
SERVER = HERE / "api_load_server.py"
READERS = 12
EXECUTORS = 4
STREAMS = 4
STREAM_SECONDS = 2.0
LEASE_WAIT = 1.0
TOKENS = {
    "admin": "load-admin-7f3a9c1e5b2d4068",
    "read": "load-read-2c8e6a4f0b9d1357",
    "executor": "load-exec-9d1b3f5a7c2e4680",
}
# one read token per event-stream client: the per-token cap on streams (8) then never refuses a
# reconnection whose previous stream the loaded server has not yet seen closed
STREAM_TOKENS = [f"load-stream-{n}-5e2a7c9b1d3f4086" for n in range(4)]


@dataclass
class Load:
    """What the clients saw during one run."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    leased: int = 0
    events: int = 0
    streams_opened: int = 0

    def record(self, kind: str, seconds: float, ok: bool) -> None:
        if ok:
            self.latencies.setdefault(kind, []).append(seconds)
        else:
            self.errors[kind] = self.errors.get(kind, 0) + 1


class Connection:
    """One keep-alive HTTP/1.1 connection, requests one at a time: a client lighter than httpx,
    so that the load's own CPU (it shares the machine with the server) weighs less in the
    latencies. JSON answers only (uvicorn sends them with a Content-Length)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        payload = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        try:
            self.writer.write(head.encode() + payload)
            assert self.reader is not None
            status_line = await self.reader.readline()
            length = 0
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            data = await self.reader.readexactly(length)
            return int(status_line.split()[1]), data
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
            self.close()
            raise

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Pace:
    """When a client's next request is due: every ``interval`` seconds (0: at once, a closed
    loop). Latency is counted from when a request was due, not from when it could be sent, so
    a slow server is not hidden by the clients waiting for it (no coordinated omission)."""

    def __init__(self, interval: float, rng: random.Random) -> None:
        self.interval = interval
        self.due = time.monotonic() + rng.random() * interval  # the clients start spread out

    async def next(self) -> float:
        if self.interval <= 0:
            return time.monotonic()
        due, self.due = self.due, self.due + self.interval
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return due


async def _reader(
    port: int, load: Load, stop: float, tasks: int, rng: random.Random, interval: float
) -> None:
    conn = Connection(port)
    pace = Pace(interval, rng)
    cycle = [
        ("tasks?limit=100", "/api/v1/tasks?limit=100"),
        ("stats", "/api/v1/stats"),
        ("tasks?status=pending", "/api/v1/tasks?status=pending&limit=100"),
        ("tasks/{key}", None),
        ("workers", "/api/v1/workers"),
        ("whoami", "/api/v1/whoami"),
    ]
    n = rng.randrange(len(cycle))
    while (due := await pace.next()) < stop:
        kind, path = cycle[n % len(cycle)]
        n += 1
        path = path or f"/api/v1/tasks/load-{rng.randrange(tasks):06}"
        try:
            status, _ = await conn.request("GET", path, TOKENS["read"])
            ok = status == 200
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
            ok = False
        load.record(kind, time.monotonic() - due, ok)
    conn.close()


async def _executor(port: int, load: Load, stop: float, n: int, rng: random.Random, interval: float) -> None:
    """Lease one task (waiting up to LEASE_WAIT), report it: two requests, each paced."""
    conn = Connection(port)
    pace = Pace(interval, rng)
    worker = f"load-executor-{n}"
    leased: list[dict[str, Any]] = []
    while (due := await pace.next()) < stop:
        if leased:
            task = leased.pop()
            body = {
                "worker_id": worker,
                "key": task["key"],
                "attempt": task["attempt"],
                "outcome": "succeeded",
            }
            kind, path = "report", "/api/v1/executors/report"
        else:
            body = {"worker_id": worker, "names": ["job"], "max_tasks": 1, "wait_seconds": LEASE_WAIT}
            kind, path = "lease", "/api/v1/executors/lease"
        try:
            status, answer = await conn.request("POST", path, TOKENS["executor"], body)
            ok = status == 200
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
            ok = False
        load.record(kind, time.monotonic() - due, ok)
        if ok and kind == "lease":
            leased = json.loads(answer)["tasks"]
            load.leased += len(leased)
    conn.close()


async def _stream(http: httpx.AsyncClient, load: Load, stop: float, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    last_id: str | None = None
    while time.monotonic() < stop:
        ask = dict(headers) | ({"Last-Event-ID": last_id} if last_id else {})
        until = min(stop, time.monotonic() + STREAM_SECONDS)
        try:
            async with http.stream("GET", "/api/v1/events/stream", headers=ask, timeout=None) as response:
                if response.status_code != 200:
                    kind = f"stream {response.status_code}"
                    load.errors[kind] = load.errors.get(kind, 0) + 1
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))  # as told
                    continue
                load.streams_opened += 1

                async def read() -> None:
                    nonlocal last_id
                    async for line in response.aiter_lines():
                        if line.startswith("id: "):
                            last_id = line[4:]
                            load.events += 1

                try:
                    await asyncio.wait_for(read(), max(until - time.monotonic(), 0.01))
                except TimeoutError:
                    pass
        except httpx.HTTPError as exc:
            kind = f"stream {type(exc).__name__}"
            load.errors[kind] = load.errors.get(kind, 0) + 1


async def drive(port: int, seconds: float, tasks: int, rate: float) -> Load:
    load = Load()
    limits = httpx.Limits(max_connections=READERS + EXECUTORS + STREAMS + 4, max_keepalive_connections=32)
    timeout = httpx.Timeout(30.0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=timeout) as http:
        rng = random.Random(7)
        stop = time.monotonic() + seconds
        interval = (READERS + EXECUTORS) / rate if rate > 0 else 0.0  # each client's share
        await asyncio.gather(
            *(
                _reader(port, load, stop, tasks, random.Random(rng.random()), interval)
                for _ in range(READERS)
            ),
            *(
                _executor(port, load, stop, n, random.Random(rng.random()), interval)
                for n in range(EXECUTORS)
            ),
            *(_stream(http, load, stop, STREAM_TOKENS[n % len(STREAM_TOKENS)]) for n in range(STREAMS)),
        )
    return load


def _wait_until_healthy(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the server did not answer /api/v1/health in time")


def one_run(build: Build | None, seconds: float, tasks: int, rate: float) -> dict[str, Any]:
    """Start the build's server, load it, stop it; the figures."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if build is not None:
        env["PYTHONPATH"] = str(build.directory)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # a free port for the server (another process could take it: unlikely)
    server = os.environ.get("LOAD_SERVER", str(SERVER))
    proc = subprocess.Popen(
        [sys.executable, server, "--tasks", str(tasks), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=None if os.environ.get("LOAD_SERVER") else subprocess.DEVNULL,  # its access log
        text=True,
        cwd="/",  # no package of the current directory shadows the build's
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("{"):
            raise RuntimeError(f"the server did not start: {line!r}")
        ready = json.loads(line)
        if build is not None and not Path(ready["mscheduler_file"]).resolve().is_relative_to(build.directory):
            raise RuntimeError(f"the server imported {ready['mscheduler_file']}, not {build.directory}")
        _wait_until_healthy(port)
        cpu_before = _cpu_seconds(ready["pid"])
        mine_before = _cpu_seconds(os.getpid())
        wall_before = time.monotonic()
        load = asyncio.run(drive(ready["port"], seconds, tasks, rate))
        wall = time.monotonic() - wall_before
        cpu = _cpu_seconds(ready["pid"]) - cpu_before
        client_cpu = _cpu_seconds(os.getpid()) - mine_before
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    measured = [v for kind, values in load.latencies.items() for v in values]
    return {
        "build": build.name if build is not None else "current",
        "rate": rate or "max",
        "requests": len(measured),
        "requests_per_s": len(measured) / wall,
        "p50_ms": _quantile(measured, 0.5) * 1000,
        "p99_ms": _quantile(measured, 0.99) * 1000,
        "server_cpu_share": cpu / wall,
        "client_cpu_share": client_cpu / wall,
        "loadavg_after": list(os.getloadavg()),
        "per_kind": {
            kind: {"n": len(v), "p50_ms": _quantile(v, 0.5) * 1000, "p99_ms": _quantile(v, 0.99) * 1000}
            for kind, v in sorted(load.latencies.items())
        },
        "errors": load.errors,
        "leased": load.leased,
        "events_streamed": load.events,
        "streams_opened": load.streams_opened,
        "seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--build", action="append", type=parse_build, default=[], metavar="NAME=DIR")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument(
        "--rate",
        type=float,
        action="append",
        default=[],
        help="requests/s the readers and executors send in all (0: as fast as they can); "
        "repeat for several loads (default: 110, the probe's, and 0)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not 1 <= args.seconds <= 600 or not 1 <= args.rounds <= 10:
        sys.exit("--seconds: 1 to 600; --rounds: 1 to 10")
    builds: list[Build | None] = list(args.build) or [None]
    facts = machine_facts()
    print(json.dumps({"machine": facts}), flush=True)
    rates = args.rate or [110.0, 0.0]
    runs = []
    for round_ in range(1, args.rounds + 1):
        for rate in rates:
            for build in builds:
                result = one_run(build, args.seconds, args.tasks, rate) | {"round": round_}
                runs.append(result)
                print(json.dumps(result), flush=True)
    print()
    print(
        "| load | build | requests/s | p50 ms | p99 ms | server CPU (one core) | rounds (req/s / p50 / p99) |"
    )
    print("|---|---|---|---|---|---|---|")
    for rate in rates:
        for build in builds:
            name = build.name if build is not None else "current"
            mine = [r for r in runs if r["build"] == name and r["rate"] == (rate or "max")]
            keys = ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_share")
            med = {k: statistics.median(r[k] for r in mine) for k in keys}
            each = ", ".join(
                f"{r['requests_per_s']:.0f} / {r['p50_ms']:.0f} / {r['p99_ms']:.0f}" for r in mine
            )
            load_name = f"{rate:g}/s" if rate else "as fast as possible"
            print(
                f"| {load_name} | {name} | {med['requests_per_s']:.0f} | {med['p50_ms']:.1f} | "
                f"{med['p99_ms']:.1f} | {med['server_cpu_share'] * 100:.0f} % | {each} |"
            )
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": facts, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
