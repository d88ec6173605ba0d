"""The REST API served by uvicorn on a free 127.0.0.1 port, in a thread with its own event loop,
over a store the test can swap (``serve(operations)``); and a plain HTTP server that is not an
mscheduler API. Loopback only."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
from typing import Any

from mscheduler import Operations
from mscheduler.web import ApiTokens, create_app
from mscheduler.web.guards import ApiLimits

ADMIN_TOKEN = "cli-admin-token-0123456789"
READ_TOKEN = "cli-read-token-0123456789"
PUBLISH_TOKEN = "cli-publish-token-0123456789"
TOKENS = ApiTokens(admin=[ADMIN_TOKEN], read=[READ_TOKEN], publish=[PUBLISH_TOKEN])


class ApiServer:
    """``create_app`` under uvicorn in a background thread; ``serve(ops)`` points it at a store."""

    def __init__(self, operations: Operations, limits: ApiLimits | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.app = create_app(operations=operations, tokens=TOKENS, metrics=False, limits=limits)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.server: Any = None
        self.thread = threading.Thread(target=self._run, name="api-server", daemon=True)

    def serve(self, operations: Operations) -> None:
        """Answer from this store from the next request on (the routes read ``app.state``)."""
        self.app.state.operations = operations

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start()
            self.error = exc
            self.ready.set()

    async def _main(self) -> None:
        import uvicorn

        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        serving = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started and not serving.done():  # noqa: ASYNC110 (uvicorn has no event)
            await asyncio.sleep(0.01)
        self.ready.set()
        await serving

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the API server did not start in 30 s")
        if self.error is not None:
            raise RuntimeError("the API server failed to start") from self.error

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html><body>a web site, not mscheduler</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class NotTheApi:
    """A plain web site on 127.0.0.1 that answers every GET with an HTML page."""

    def __init__(self) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> NotTheApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
