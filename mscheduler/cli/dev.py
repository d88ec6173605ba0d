"""``mscheduler dev APP``: the whole scheduler in one process with no database — an
in-memory store, the consumers (with their planners) of ``APP``, the REST API and the dashboard —
until Ctrl-C. ``APP`` is an ``mscheduler.App`` (``module:attribute``, as ``worker`` takes), the
same object ``mscheduler worker`` runs against MongoDB.

The admin token is ``--token``, or one made at start and printed with the addresses. ``--data
FILE`` keeps the store across restarts: loaded at start, written every ``--save-every`` seconds
and at stop (``mscheduler.drivers.memory.snapshot`` says what a crash can lose). Exits 0 after
Ctrl-C, 1 if it cannot start (the port is taken, a consumer fails), 2 on bad arguments (an app
that does not import or defines no consumer, a token too short, a file that is not a snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from mscheduler.cli.common import (
    EXIT_USAGE,
    CliError,
    Say,
    app,
    exit_with,
    import_target,
    one_line,
    plain_say,
)
from mscheduler.cli.web import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_KEEP_ALIVE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    HeaderTimeoutOpt,
    KeepAliveTimeoutOpt,
    MaxConnectionsOpt,
)
from mscheduler.domain.exceptions import InvalidInput, MSchedulerError
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.memory.snapshot import load, save
from mscheduler.observability.logs import configure_logging
from mscheduler.operations import Operations
from mscheduler.runtime.app import App
from mscheduler.runtime.consumer import Consumer

DEFAULT_PORT = 8000
DEFAULT_SAVE_EVERY = 5.0
STOP_GRACE = 5.0  # seconds running handlers get at Ctrl-C (a second Ctrl-C: at once)

log = logging.getLogger("mscheduler.cli")


def load_app(spec: str) -> App:
    """The ``App`` that ``spec`` names, or a one-line usage error (exit 2)."""
    try:
        target = import_target(spec)
    except CliError as exc:
        raise CliError(str(exc).splitlines()[0] if exc.exit_code == 2 else _import_failure(exc), 2) from exc
    if not isinstance(target, App):
        raise CliError(
            f"{spec} is a {type(target).__name__}, not an mscheduler.App: dev runs an App, whose "
            "handlers are defined apart from the store (see examples/shop.py)",
            exit_code=EXIT_USAGE,
        )
    if not target.names:
        raise CliError(f"{spec} defines no consumer: register a handler with @app.handler(NAME)", EXIT_USAGE)
    return target


def _import_failure(exc: CliError) -> str:
    """The user's module raised on import: its last line (the exception), on one line."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return one_line(f"{lines[0]} {lines[-1].strip()}" if len(lines) > 1 else lines[0], limit=300)


EARLY_BACKLOG = 128  # connections queued before the server takes the socket over


def _listening(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything starts (a taken port fails at once) and
    listening: a client that connects once the banner is printed waits in the backlog until the
    server accepts, instead of being refused while the server starts (the server listens again
    with its own backlog)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(EARLY_BACKLOG)
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


class _Server:
    """uvicorn's server without its signal handling: ``dev`` handles Ctrl-C itself (and uvicorn
    would raise the signal again after serving)."""

    def __init__(self, app: Any, sock: socket.socket, settings: Any = None) -> None:
        import uvicorn

        from mscheduler.web.serving import ServerSettings, uvicorn_config

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Any:  # uvicorn >= 0.29
                yield

            def install_signal_handlers(self) -> None:  # older uvicorn
                return None

        settings = settings if settings is not None else ServerSettings()
        config, self.guard = uvicorn_config(
            app, settings, log_level="warning", access_log=False, lifespan="on"
        )
        self.server = Server(config)
        self.sock = sock

    async def serve(self) -> None:
        await self.server.serve(sockets=[self.sock])

    def stop(self) -> None:
        self.server.should_exit = True


async def run_dev(
    spec: str,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    data: Path | None = None,
    save_every: float = DEFAULT_SAVE_EVERY,
    say: Say = plain_say,
    server_settings: Any = None,
) -> int:
    """Run ``spec``'s app on an in-memory store with the API and the dashboard until SIGINT /
    SIGTERM; the exit code. ``server_settings``: ``mscheduler.web.serving.ServerSettings``."""
    from mscheduler.web import ApiTokens, create_app

    application = load_app(spec)
    token = token or secrets.token_urlsafe(24)
    try:
        tokens = ApiTokens(admin=[token])
    except InvalidInput as exc:
        raise CliError(f"--token: {exc}", exit_code=EXIT_USAGE) from exc
    driver = MemoryDriver(events=True)
    restored = 0
    if data is not None and await asyncio.to_thread(data.exists):
        try:
            restored = load(driver, data)
        except InvalidInput as exc:
            raise CliError(f"--data: {exc}", exit_code=EXIT_USAGE) from exc
    try:
        consumers = application.consumers(driver)
    except InvalidInput as exc:
        raise CliError(f"{spec}: {exc}", exit_code=EXIT_USAGE) from exc
    sock = _listening(host, port)
    operations = Operations(driver)
    server = _Server(create_app(operations=operations, tokens=tokens), sock, server_settings)
    started: list[Consumer] = []
    try:
        for consumer in consumers:
            await consumer.start()
            started.append(consumer)
        await application.add_plans(operations)
    except MSchedulerError as exc:
        await asyncio.gather(*(c.stop(grace=0) for c in started), return_exceptions=True)
        sock.close()
        raise CliError(f"{spec} could not start: {one_line(str(exc), 300)}") from exc
    return await _serve(application, consumers, server, driver, data, save_every, restored, token, say)


async def _serve(
    application: App,
    consumers: list[Consumer],
    server: _Server,
    driver: MemoryDriver,
    data: Path | None,
    save_every: float,
    restored: int,
    token: str,
    say: Say,
) -> int:
    host, port = server.sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    loop = asyncio.get_running_loop()
    signals = 0
    stops: list[asyncio.Future[None]] = []

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        name = signal.Signals(signum).name
        if signals == 1:
            say(f"received {name}: stopping (running handlers get {STOP_GRACE:g}s; {name} again: now)")
            server.stop()
        else:
            stops.extend(asyncio.ensure_future(c.stop(grace=0)) for c in consumers)

    handled = (signal.SIGINT, signal.SIGTERM)
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    saver = asyncio.ensure_future(_save_every(driver, data, save_every)) if data is not None else None
    kept = f"; store kept in {data} ({restored} task(s) loaded)" if data is not None else " (in memory only)"
    say(
        f"mscheduler dev: {application.name} — {len(consumers)} consumer(s) for "
        f"{', '.join(application.names)}{kept}\n"
        f"  dashboard  {url}/ui/\n"
        f"  REST API   {url}/api/v1\n"
        f"  token      {token}   (admin: log in to the dashboard with it)\n"
        f"  try        export MSCHEDULER_TOKEN={token}; mscheduler tasks ls --api-url {url}\n"
        "             (the token in the environment, not on a command line, where process lists show it)\n"
        f"Ctrl+C to stop"
    )
    try:
        serving = asyncio.ensure_future(server.serve())
        died = [asyncio.ensure_future(c.wait_stopped()) for c in consumers]
        await asyncio.wait([serving, *died], return_when=asyncio.FIRST_COMPLETED)
        failed = [c for c in consumers if c.error is not None]
        for consumer in failed:
            say(f"consumer {consumer.worker_id} stopped on an error: {consumer.error!r}", level=logging.ERROR)
        server.stop()
        await asyncio.gather(serving, return_exceptions=True)
        for waiter in died:
            waiter.cancel()
        await asyncio.gather(*(c.stop(grace=STOP_GRACE) for c in consumers), *stops, return_exceptions=True)
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        if saver is not None:
            saver.cancel()
            await asyncio.gather(saver, return_exceptions=True)
        server.sock.close()
    if data is not None:
        size = save(driver, data, datetime.now(UTC))
        say(f"mscheduler dev: saved the store to {data} ({size} bytes)")
    say("mscheduler dev: stopped")
    return 1 if failed else 0


async def _save_every(driver: MemoryDriver, path: Path | None, seconds: float) -> None:
    """Write the store every ``seconds`` (serialised on the loop: one instant; written in a thread)."""
    from bson import json_util

    from mscheduler.drivers.memory.snapshot import CANONICAL_JSON, dump, write_text

    assert path is not None
    while True:
        await asyncio.sleep(seconds)
        text = json_util.dumps(dump(driver, datetime.now(UTC)), json_options=CANONICAL_JSON)
        try:
            await asyncio.to_thread(write_text, path, text)
        except OSError as exc:
            log.error("could not save the store to %s: %s", path, exc)


@app.command(short_help="Run an App with no database: store, consumers, REST API, dashboard.")
def dev(
    target: Annotated[str, typer.Argument(metavar="MODULE:ATTR", hidden=True)],
    port: Annotated[
        int, typer.Option(metavar="PORT", min=0, max=65535, help="Port to serve on.")
    ] = DEFAULT_PORT,
    host: Annotated[str, typer.Option(metavar="HOST", help="Address to listen on.")] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            metavar="TOKEN", envvar="MSCHEDULER_TOKEN", help="The admin token (default: a new one, printed)."
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="Keep the store in FILE: loaded at start, saved while running and at stop."
        ),
    ] = None,
    save_every: Annotated[
        float, typer.Option(metavar="SECONDS", min=0.1, max=3600, help="With --data: how often to save.")
    ] = DEFAULT_SAVE_EVERY,
    log_level: Annotated[str, typer.Option(metavar="LEVEL", help="Logging level.")] = "WARNING",
    max_connections: MaxConnectionsOpt = DEFAULT_MAX_CONNECTIONS,
    header_timeout: HeaderTimeoutOpt = DEFAULT_HEADER_TIMEOUT,
    keep_alive_timeout: KeepAliveTimeoutOpt = DEFAULT_KEEP_ALIVE_TIMEOUT,
) -> None:
    """Run the App MODULE:ATTR (e.g. examples.shop:app) on an in-memory store, with the REST API
    and the dashboard, until Ctrl+C: no MongoDB needed. The same App runs on MongoDB with
    `mscheduler worker MODULE:ATTR --mongodb-uri URI`. Exits 0 after Ctrl+C, 1 if it cannot start,
    2 on bad arguments (an App that does not import or has no handler)."""
    try:
        import uvicorn  # noqa: F401

        import mscheduler.web  # noqa: F401
    except ImportError as exc:
        hint = f"dev serves the REST API: pip install 'mscheduler[web]' ({exc})"
        raise exit_with(CliError(hint, exit_code=EXIT_USAGE)) from None
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise exit_with(CliError(f"unknown log level {log_level!r}", exit_code=EXIT_USAGE))
    configure_logging(level, "text")
    from mscheduler.web.serving import ServerSettings

    try:
        settings = ServerSettings(
            max_connections=max_connections,
            header_timeout=header_timeout,
            keep_alive_timeout=keep_alive_timeout,
        )
    except InvalidInput as exc:
        raise exit_with(CliError(str(exc), exit_code=EXIT_USAGE)) from None
    try:
        code = asyncio.run(
            run_dev(
                target,
                host=host,
                port=port,
                token=token,
                data=data,
                save_every=save_every,
                server_settings=settings,
            )
        )
    except CliError as exc:
        raise exit_with(exc) from None
    except KeyboardInterrupt:
        raise exit_with(CliError("interrupted while starting", exit_code=130)) from None
    raise typer.Exit(code)
