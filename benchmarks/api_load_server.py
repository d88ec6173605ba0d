"""The API server of ``benchmarks/api_load.py``: ``mscheduler web`` of the build (its ``serve``)
over a MemoryDriver with the event log on and ``--tasks`` pending tasks, on 127.0.0.1:``--port``
(loopback only).

Run by ``api_load.py`` as a fresh process with ``PYTHONPATH=<build>``, so only the ``mscheduler``
package differs between builds; it imports nothing from this checkout but the standard library.
Prints one JSON line ``{"port": ..., "pid": ..., "mscheduler_file": ...}`` when it starts
serving (the driver then waits for ``/api/v1/health``), and serves until it is terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

TOKENS = {
    "admin": "load-admin-7f3a9c1e5b2d4068",
    "read": "load-read-2c8e6a4f0b9d1357",
    "executor": "load-exec-9d1b3f5a7c2e4680",
}
# one read token per event-stream client: the per-token cap on streams (8) then never refuses a
# reconnection whose previous stream the loaded server has not yet seen closed
STREAM_TOKENS = [f"load-stream-{n}-5e2a7c9b1d3f4086" for n in range(4)]


async def serve(tasks: int, port: int) -> None:
    """``mscheduler web`` as the build has it (its ``serve``: uvicorn, access log, whatever it
    sets up), over a MemoryDriver instead of MongoDB (its ``operations_override`` hook)."""
    import mscheduler
    from mscheduler import MemoryDriver, Operations, Publisher, Task
    from mscheduler.cli import web as cli_web
    from mscheduler.web import parse_tokens

    driver = MemoryDriver(events=True)
    publisher = Publisher(driver)
    batch = 1000
    for start in range(0, tasks, batch):
        keys = range(start, min(start + batch, tasks))
        await publisher.send_many([Task(f"load-{i:06}", "job", {"n": i, "note": "x" * 64}) for i in keys])
    operations = Operations(driver)
    cli_web.operations_override = lambda: operations
    items = [f"{role}:{token}" for role, token in TOKENS.items()] + [f"read:{t}" for t in STREAM_TOKENS]
    tokens = parse_tokens(",".join(items))
    ready = {"port": port, "pid": os.getpid(), "mscheduler_file": mscheduler.__file__}
    print(json.dumps(ready), flush=True)
    await cli_web.serve(
        uri="mongodb://unused.invalid/",
        database=None,
        prefix="",
        host="127.0.0.1",
        port=port,
        tokens=tokens,
        server_selection_timeout_ms=None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if not 1 <= args.tasks <= 1_000_000:
        sys.exit("--tasks: 1 to 1,000,000")
    asyncio.run(serve(args.tasks, args.port))


if __name__ == "__main__":
    main()
