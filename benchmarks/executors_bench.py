"""Benchmark: remote executors over HTTP (SPEC F30) — throughput and HTTP requests per task.

A real uvicorn server on localhost (a separate process: the API over a ``MemoryDriver``, the
tasks published before it starts) and, in this process, ``--executors`` ``ExecutorClient``s
(concurrency 1 each, long polls of 2 s) running a no-op handler until every task is reported.
Measured from the first lease sent to the last report answered: tasks/s, and the HTTP requests
the executors sent (lease, ping, report) per task. ``--asgi`` runs the app in this process
through httpx's ASGI transport instead (no sockets, one event loop for both sides).
``--limit N`` puts the task name under a flow limit ``max_running=N`` (a never-reached limit when
N is above the executors' concurrency): each lease then takes slots, each ping extends them and
each report releases them.

    python -m benchmarks.executors_bench [--tasks 3000] [--executors 10] [--asgi] [--limit 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from typing import Any

import httpx

from benchmarks.common import emit, machine
from mscheduler import MemoryDriver, Operations, Publisher, Task
from mscheduler.remote.client import ExecutorClient, RemoteTask
from mscheduler.web import ApiTokens, create_app

TOKEN = "bench-executor-token-0123456789"
NAME = "noop"


async def build_app(tasks: int, limit: int | None = None) -> Any:
    """The API over a MemoryDriver holding ``tasks`` no-op tasks (published before it serves),
    their name under a flow limit of ``max_running=limit`` if given."""
    driver = MemoryDriver()
    await Publisher(driver).send_many([Task(f"t{n}", NAME, None) for n in range(tasks)])
    if limit is not None:
        await Operations(driver).set_limit(NAME, max_running=limit)
    return create_app(
        operations=Operations(driver), tokens=ApiTokens(executor=[TOKEN]), metrics=False, dashboard=False
    )


def serve(port: int, tasks: int, limit: int | None) -> None:
    import uvicorn

    uvicorn.run(
        asyncio.run(build_app(tasks, limit)),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_ready(base_url: str, deadline: float) -> None:
    async with httpx.AsyncClient(base_url=base_url) as http:
        while True:
            try:
                if (await http.get("/api/v1/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            await asyncio.sleep(0.05)


async def drive(
    base_url: str, tasks: int, executors: int, transport: httpx.AsyncBaseTransport | None
) -> dict[str, Any]:
    done = 0
    all_done = asyncio.Event()
    finished_at = 0.0

    async def noop(task: RemoteTask) -> None:
        return None

    clients = [
        ExecutorClient(base_url, TOKEN, f"bench-{n}", [NAME], wait_seconds=2, transport=transport)
        for n in range(executors)
    ]

    def count_reports(client: ExecutorClient) -> None:
        original = client.report

        async def report(*args: Any, **kwargs: Any) -> dict[str, Any]:
            nonlocal done, finished_at
            answer = await original(*args, **kwargs)
            done += 1
            if done == tasks:
                finished_at = time.perf_counter()
                all_done.set()
            return answer

        client.report = report  # type: ignore[method-assign]

    for client in clients:
        count_reports(client)
    started = time.perf_counter()
    runs = [asyncio.ensure_future(client.run(noop)) for client in clients]
    await all_done.wait()
    requests = sum(client.requests for client in clients)
    for run in runs:
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)
    for client in clients:
        await client.aclose()
    elapsed = finished_at - started
    by_kind = {
        "leased": sum(c.stats["leased"] for c in clients),
        "reported": sum(c.stats["reported"] for c in clients),
    }
    return {
        "tasks": tasks,
        "seconds": round(elapsed, 3),
        "tasks_per_s": round(tasks / elapsed, 1),
        "http_requests": requests,
        "requests_per_task": round(requests / tasks, 3),
        "counts": by_kind,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if args.asgi:
        app = await build_app(args.tasks, args.limit)
        result = await drive("http://bench", args.tasks, args.executors, httpx.ASGITransport(app=app))
        if args.limit is not None:  # the server's store commands for the limit (in process only)
            commands = app.state.executors.limiter.commands
            result["limit_commands_per_task"] = {k: round(v / args.tasks, 3) for k, v in commands.items()}
        return result
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        *[
            sys.executable,
            "-m",
            "benchmarks.executors_bench",
            "--serve",
            str(port),
            "--tasks",
            str(args.tasks),
            *(["--limit", str(args.limit)] if args.limit is not None else []),
        ],
        env=os.environ | {"PYTHONPATH": os.getcwd()},
    )
    try:
        base_url = f"http://127.0.0.1:{port}"
        await wait_ready(base_url, time.monotonic() + 60)
        return await drive(base_url, args.tasks, args.executors, None)
    finally:
        server.terminate()
        await server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--executors", type=int, default=10)
    parser.add_argument("--asgi", action="store_true", help="the app in process (no uvicorn)")
    parser.add_argument(
        "--limit", type=int, metavar="N", help="a flow limit max_running=N on the tasks' name"
    )
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.tasks, args.limit)
        return
    result = asyncio.run(main_async(args))
    emit(
        {
            "benchmark": "executors",
            "server": "in-process ASGI" if args.asgi else "uvicorn on 127.0.0.1 (separate process)",
            "executors": args.executors,
            "limit": {"max_running": args.limit} if args.limit is not None else None,
            **result,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
