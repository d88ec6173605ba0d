"""The event stream under volume: does the server keep answering while event streams replay a
large log during a burst of tasks?

The scene (a server per run, ``events_volume_server.py``: ``mscheduler web``'s serve over a
MemoryDriver with the event log on and a consumer of the burst's tasks in the same process):

* the log holds ``--events`` (100,000) events when the run starts;
* 3 read tokens open ``GET /events/stream?since=<the oldest stored event>`` at once (a replay of
  the whole log, then live), and one more follows it live from now (a dashboard tab);
* a publish token sends ``--burst`` (20,000) tasks in batches of 1,000, as fast as the server
  takes them; the consumer runs them (a no-op handler): ``sent``, ``claimed`` and ``succeeded``
  events stream to all four while the replays go on;
* a separate process asks ``GET /api/v1/health`` every 20 ms from the start until every burst
  task succeeded and every replay reached the log's end (or ``--max-seconds`` passed). Its
  latency counts from when each request was due (no coordinated omission), on a keep-alive
  connection; a request that took longer than its interval delays the next, which then counts
  its wait too.

Measured: /health p50 / p99 / max and how many answered; the events each stream received and the
replays' rate; how long the burst took (first send to last success); the server's CPU (a share
of one core); the machine's load average before and after. Nothing is asserted here;
``tests/web/test_api_event_volume.py`` holds a smaller case that counts work instead of time.

    python -m benchmarks.events_volume                                  # this checkout
    python -m benchmarks.events_volume --build before=/work/build-main --build after=. --rounds 2
                                       [--events 100000] [--burst 20000] [--max-seconds 180] [--json F]
                                       [--server-nice -10]   (root: the server ahead of the machine's
                                                              other processes, as on a host of its own)

``VOLUME_PROFILE=FILE`` writes the server's cProfile to FILE; ``VOLUME_LAG=FILE`` writes the
loop's worst turns per second, the 40 slowest callbacks and the garbage collector's passes.

Builds alternate round by round (A B, A B, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.compare import Build, machine_facts, parse_build

HERE = Path(__file__).resolve().parent
SERVER = HERE / "events_volume_server.py"
TOKENS = {
    "admin": "vol-admin-7f3a9c1e5b2d4068aa",
    "publish": "vol-publish-2c8e6a4f0b9d13",
    "live": "vol-live-9d1b3f5a7c2e4680bb",
    "replay-0": "vol-replay-0-5e2a7c9b1d3f40",
    "replay-1": "vol-replay-1-6f3b8d0c2e4a51",
    "replay-2": "vol-replay-2-7a4c9e1d3f5b62",
}
POLL_INTERVAL = 0.02
BATCH = 1000


# -- the /health poller (a process of its own: the readers' CPU does not delay its clock) --------


def poll_health(port: int) -> None:
    """Ask /health every POLL_INTERVAL until stdin closes; print the latencies (JSON)."""
    latencies: list[float] = []
    failures = 0
    conn: socket.socket | None = None
    request = b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    due = time.monotonic()
    while not select.select([sys.stdin], [], [], 0)[0]:
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            if conn is None:
                conn = socket.create_connection(("127.0.0.1", port), timeout=60)
            conn.sendall(request)
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                chunk = conn.recv(4096)
                if not chunk:
                    raise OSError("closed")
                answer += chunk
            ok = answer.startswith(b"HTTP/1.1 200")
        except OSError:
            ok = False
            if conn is not None:
                conn.close()
            conn = None
        if ok:
            latencies.append(time.monotonic() - due)
        else:
            failures += 1
        due += POLL_INTERVAL
        due = max(due, time.monotonic() - POLL_INTERVAL)  # a stall is one late request, not many
    print(json.dumps({"latencies": latencies, "failures": failures}), flush=True)


# -- the clients -----------------------------------------------------------------------------------


async def _open(port: int, path: str, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"{path}: {status!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    return reader, writer


async def follow(port: int, path: str, token: str, counts: dict[str, int], name: str) -> None:
    """Count the events of a stream (``event:`` lines; chunked framing is left in the bytes), and
    its ``succeeded`` ones under ``<name>:succeeded``."""
    reader, writer = await _open(port, path, token)
    tail = b""
    marks = ((name, b"\nevent: "), (f"{name}:succeeded", b"\nevent: succeeded\n"))
    try:
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            data = tail + chunk
            tail = data[-24:]
            for key, mark in marks:  # a mark cut by the chunk's end is counted with the next one
                counts[key] += data.count(mark) - tail.count(mark)
    finally:
        writer.close()


async def post(port: int, path: str, token: str, body: Any) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + payload
    )
    data = await reader.read()
    writer.close()
    return int(data.split(b" ", 2)[1]), data.partition(b"\r\n\r\n")[2]


async def burst(port: int, count: int, counts: dict[str, int]) -> float:
    """Send ``count`` tasks in batches; the moment the live stream told the last one succeeded."""
    for first in range(0, count, BATCH):
        tasks = [{"key": f"burst-{i:06}", "name": "job"} for i in range(first, min(first + BATCH, count))]
        status, body = await post(port, "/api/v1/tasks", TOKENS["publish"], {"tasks": tasks})
        if status not in (200, 201):
            raise RuntimeError(f"send: {status} {body[:200]!r}")
    while True:
        if counts["live:succeeded"] >= count:
            return time.monotonic()
        await asyncio.sleep(0.1)


async def scene(
    port: int, log_from: str, events: int, count: int, max_seconds: float, replays: int = 3
) -> dict[str, Any]:
    names = ("replay-0", "replay-1", "replay-2", "live")
    counts = {key: 0 for name in names for key in (name, f"{name}:succeeded")}
    since = log_from.replace("+", "%2B")
    followers = [
        asyncio.create_task(follow(port, f"/api/v1/events/stream?since={since}", TOKENS[n], counts, n))
        for n in names[:replays]
    ]
    followers.append(
        asyncio.create_task(follow(port, "/api/v1/events/stream", TOKENS["live"], counts, "live"))
    )
    started = time.monotonic()
    sender = asyncio.create_task(burst(port, count, counts))
    burst_end: float | None = None
    # every burst task ran (3 events each: sent, claimed, succeeded) and every replay has the log
    wanted = events + 3 * count
    while time.monotonic() - started < max_seconds:
        if sender.done():
            burst_end = sender.result()
            if all(counts[f"replay-{n}"] >= wanted for n in range(replays)):
                break
        await asyncio.sleep(0.2)
    elapsed = time.monotonic() - started
    for task in [*followers, sender]:
        task.cancel()
    await asyncio.gather(*followers, sender, return_exceptions=True)
    return {
        "counts": counts,
        "wanted_per_replay": wanted,
        "seconds": elapsed,
        "burst_seconds": (burst_end - started) if burst_end is not None else None,
        "timed_out": elapsed >= max_seconds,
    }


# -- one run -------------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port: int = probe.getsockname()[1]
    probe.close()
    return port


def _wait_healthy(port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                conn.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if conn.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the server did not answer /api/v1/health in time")


def one_run(
    build: Build | None, events: int, count: int, max_seconds: float, replays: int = 3, nice: int = 0
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if build is not None:
        env["PYTHONPATH"] = str(build.directory)
    port = _free_port()
    load_before = list(os.getloadavg())
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--events", str(events), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # its access log
        text=True,
        cwd="/",  # no package of the current directory shadows the build's
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )
    poller = None
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("{"):
            raise RuntimeError(f"the server did not start: {line!r}")
        ready = json.loads(line)
        if build is not None and not Path(ready["mscheduler_file"]).resolve().is_relative_to(build.directory):
            raise RuntimeError(f"the server imported {ready['mscheduler_file']}, not {build.directory}")
        _wait_healthy(port)
        poller = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.events_volume", "--poll", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=HERE.parent,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,  # its clock as prompt as the server
        )
        cpu_before = _cpu_seconds(ready["pid"])
        wall_before = time.monotonic()
        seen = asyncio.run(scene(port, ready["log_from"], events, count, max_seconds, replays))
        cpu = (_cpu_seconds(ready["pid"]) - cpu_before) / (time.monotonic() - wall_before)
        out, _ = poller.communicate("stop\n", timeout=120)
        polled = json.loads(out)
    finally:
        if poller is not None and poller.poll() is None:
            poller.kill()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    latencies = polled["latencies"]
    replayed = [seen["counts"][f"replay-{n}"] for n in range(replays)]
    replay_rate = statistics.median(replayed) / seen["seconds"] if replayed else 0.0
    return {
        "build": build.name if build is not None else "current",
        "health_n": len(latencies),
        "health_failures": polled["failures"],
        "health_p50_ms": _quantile(latencies, 0.5) * 1000,
        "health_p99_ms": _quantile(latencies, 0.99) * 1000,
        "health_max_ms": max(latencies, default=float("nan")) * 1000,
        "replay_events_per_s": replay_rate,
        "server_cpu_share": cpu,
        "server_nice": nice,
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
        **seen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--build", action="append", type=parse_build, default=[], metavar="NAME=DIR")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=20_000)
    parser.add_argument("--max-seconds", type=float, default=180.0)
    parser.add_argument("--replays", type=int, default=3, choices=range(4), help="replaying streams")
    parser.add_argument(
        "--server-nice",
        type=int,
        default=0,
        help="the server's and the /health poller's niceness (negative, as root: ahead of the "
        "machine's other processes, as on a host of their own)",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--poll", type=int, default=None, help=argparse.SUPPRESS)  # the poller process
    args = parser.parse_args()
    if args.poll is not None:
        poll_health(args.poll)
        return
    if not 1 <= args.rounds <= 10 or not 1 <= args.max_seconds <= 1800:
        sys.exit("--rounds: 1 to 10; --max-seconds: 1 to 1800")
    builds: list[Build | None] = list(args.build) or [None]
    facts = machine_facts()
    print(json.dumps({"machine": facts}), flush=True)
    runs = []
    for round_ in range(1, args.rounds + 1):
        for build in builds:
            result = one_run(
                build, args.events, args.burst, args.max_seconds, args.replays, args.server_nice
            ) | {"round": round_}
            runs.append(result)
            print(json.dumps(result), flush=True)
    print()
    print("| build | /health p50 ms | p99 ms | max ms | answered | replay events/s | burst s | server CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        burst_s = f"{r['burst_seconds']:.1f}" if r["burst_seconds"] is not None else "not done"
        print(
            f"| {r['build']} (round {r['round']}{', timed out' if r['timed_out'] else ''}) | "
            f"{r['health_p50_ms']:.1f} | {r['health_p99_ms']:.1f} | {r['health_max_ms']:.0f} | "
            f"{r['health_n']} ({r['health_failures']} failed) | {r['replay_events_per_s']:.0f} | "
            f"{burst_s} | {r['server_cpu_share'] * 100:.0f} % |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": facts, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
