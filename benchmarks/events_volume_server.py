"""The server of ``benchmarks/events_volume.py``: ``mscheduler web`` of the build (its ``serve``:
uvicorn and whatever it sets up) over a MemoryDriver whose event log already holds ``--events``
events, with a consumer of the ``job`` tasks (a no-op handler, concurrency 32) in the same
process, as ``mscheduler dev`` runs one. Loopback only.

Run as a fresh process with ``PYTHONPATH=<build>``, so only the ``mscheduler`` package differs
between builds; it imports nothing from this checkout but the standard library. Prints one JSON
line ``{"port", "pid", "mscheduler_file", "log_from"}`` when it starts serving (``log_from``: the
stored time of the oldest event, where a replay starts) and serves until terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta

TOKENS = {
    "admin": "vol-admin-7f3a9c1e5b2d4068aa",
    "publish": "vol-publish-2c8e6a4f0b9d13",
    "live": "vol-live-9d1b3f5a7c2e4680bb",
    "replay-0": "vol-replay-0-5e2a7c9b1d3f40",
    "replay-1": "vol-replay-1-6f3b8d0c2e4a51",
    "replay-2": "vol-replay-2-7a4c9e1d3f5b62",
}


async def fill(driver: object, count: int) -> datetime:
    """``count`` events in the log, 500 per insert, stored over the last few seconds."""
    from mscheduler.domain.events import EventKind, EventWriter, event_doc
    from mscheduler.drivers.base import InsertEventsParams

    writer = EventWriter()
    start = datetime.now(UTC) - timedelta(seconds=30)
    for first in range(0, count, 500):
        when = start + timedelta(milliseconds=first // 500)
        docs = [
            event_doc(EventKind.SENT, f"old-{i:06}", "job", when, writer=writer)
            for i in range(first, min(first + 500, count))
        ]
        await driver.insert_events(InsertEventsParams(docs, when))  # type: ignore[attr-defined]
    return start


async def loop_turns(path: str) -> None:
    """Every 5 ms: how late the loop woke this task and how much CPU its thread used since;
    the worst of each second, written to ``path`` (JSON lines) as they come."""
    import time

    def write(line: str, mode: str = "a") -> None:
        with open(path, mode, encoding="utf-8") as out:
            out.write(line)

    write("", "w")
    worst_late = worst_cpu = 0.0
    second = time.monotonic() + 1
    while True:
        due, cpu = time.monotonic() + 0.005, time.thread_time()
        await asyncio.sleep(0.005)
        late, used = time.monotonic() - due, time.thread_time() - cpu
        worst_late, worst_cpu = max(worst_late, late), max(worst_cpu, used)
        if time.monotonic() >= second:
            write(json.dumps({"late_ms": worst_late * 1000, "cpu_ms": worst_cpu * 1000}) + "\n")
            worst_late = worst_cpu = 0.0
            second += 1


def slowest_callbacks(path: str) -> None:
    """Time every callback the loop runs; at exit, the 40 slowest (what ran, CPU ms) to ``path``."""
    import atexit
    import heapq
    import time

    slowest: list[tuple[float, str]] = []
    run = asyncio.events.Handle._run

    def where(task: object) -> str:
        coro = getattr(task, "get_coro", lambda: None)()
        frames = []
        while coro is not None and len(frames) < 12:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None:
                frames.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        return " > ".join(frames)

    def timed(handle: asyncio.events.Handle) -> None:
        task = getattr(handle._callback, "__self__", None)
        before = where(task) if task is not None else ""
        start = time.thread_time()
        run(handle)
        used = time.thread_time() - start
        if len(slowest) < 40 or used > slowest[0][0]:
            what = f"{repr(handle)[:100]}\n      from {before}\n      to   {where(task) if task else ''}"
            (heapq.heappush if len(slowest) < 40 else heapq.heapreplace)(slowest, (used, what))

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    import gc

    collections: list[tuple[int, float]] = []  # (generation, ms) of the garbage collector's passes
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            collections.append((info["generation"], (time.thread_time() - started[0]) * 1000))

    gc.callbacks.append(on_gc)

    def write() -> None:
        with open(path, "w", encoding="utf-8") as out:
            for used, what in sorted(slowest, reverse=True):
                out.write(f"{used * 1000:8.1f} ms  {what}\n")
            for generation in (0, 1, 2):
                times = sorted(ms for g, ms in collections if g == generation)
                if times:
                    out.write(f"gc gen {generation}: {len(times)} passes, max {times[-1]:.1f} ms\n")

    atexit.register(write)


async def serve(events: int, port: int) -> None:
    import mscheduler
    from mscheduler import App, MemoryDriver, Operations
    from mscheduler.cli import web as cli_web
    from mscheduler.web import parse_tokens

    driver = MemoryDriver(events=True, max_events=max(events * 3, 100_000))
    log_from = await fill(driver, events)
    app = App("volume")

    @app.handler("job")
    async def job(params: object, ctx: object) -> None:
        return None

    lag_to = os.environ.get("VOLUME_LAG")  # a file: the loop's turns (CPU between two of them)
    if lag_to:
        asyncio.get_running_loop().create_task(loop_turns(lag_to))
        slowest_callbacks(lag_to + ".callbacks")
    consumers = app.consumers(driver, concurrency=32)
    for consumer in consumers:
        await consumer.start()
    operations = Operations(driver)
    cli_web.operations_override = lambda: operations
    roles = {"admin": "admin", "publish": "publish"}
    items = [f"{roles.get(name, 'read')}:{token}" for name, token in TOKENS.items()]
    tokens = parse_tokens(",".join(items))
    ready = {
        "port": port,
        "pid": os.getpid(),
        "mscheduler_file": mscheduler.__file__,
        "log_from": log_from.isoformat(),
    }
    print(json.dumps(ready), flush=True)
    try:
        await cli_web.serve(
            uri="mongodb://unused.invalid/",
            database=None,
            prefix="",
            host="127.0.0.1",
            port=port,
            tokens=tokens,
            server_selection_timeout_ms=None,
        )
    finally:
        for consumer in consumers:
            await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if not 1 <= args.events <= 1_000_000:
        sys.exit("--events: 1 to 1,000,000")
    profile_to = os.environ.get("VOLUME_PROFILE")  # a file: the server's cProfile, written at its end
    if os.environ.get("VOLUME_LAG"):
        import signal

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # (uvicorn raises it again at its end)
    if not profile_to:
        asyncio.run(serve(args.events, args.port))
        return
    import cProfile
    import signal

    # uvicorn raises the signal again once it stopped: end with SystemExit, so the profile is written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with cProfile.Profile() as profile:
        try:
            asyncio.run(serve(args.events, args.port))
        finally:
            profile.dump_stats(profile_to)


if __name__ == "__main__":
    main()
