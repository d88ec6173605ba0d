"""``mscheduler web``: the REST API (``mscheduler.web``) served by uvicorn over one MongoDB store.

Tokens come from the environment (``MSCHEDULER_API_TOKENS="admin:...,read:...,executor:..."``) or a file
(``--tokens-file`` / ``MSCHEDULER_API_TOKENS_FILE``, one ``role:token`` per line), never from a
command-line value (it would show in process lists). Exits 2 on bad arguments or tokens, 3 if
MongoDB cannot be reached at start.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from mscheduler.cli.common import (
    EXIT_STORAGE,
    EXIT_USAGE,
    URI_TIMEOUT_HINT,
    CliError,
    DatabaseOpt,
    PrefixOpt,
    TimeoutMs,
    UriOpt,
    app,
    database_of,
    ensure_reachable,
    exit_with,
    mongo_client,
    plain_say,
    redact,
)
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.observability.logs import configure_logging
from mscheduler.operations import Operations

# ``mscheduler web`` and ``dev``: how the server treats connections (``ServerSettings`` of
# mscheduler.web.serving, whose defaults these are: that module needs the web extra, the
# options' help does not; a test keeps them equal)
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0
MaxConnectionsOpt = Annotated[
    int,
    typer.Option(metavar="N", min=1, help="Connections open at once; one more closes the one idle longest."),
]
HeaderTimeoutOpt = Annotated[
    float,
    typer.Option(metavar="SECONDS", min=0.1, max=3600, help="Time a client has to send a request's headers."),
]
KeepAliveTimeoutOpt = Annotated[
    float,
    typer.Option(metavar="SECONDS", min=0.1, max=3600, help="Time an idle kept-alive connection stays open."),
]

TOKENS_ENV = "MSCHEDULER_API_TOKENS"
TOKENS_FILE_ENV = "MSCHEDULER_API_TOKENS_FILE"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000

# A testing hook, like cli_ops.operations_override: when set, ``web`` serves the Operations it
# returns instead of connecting to MongoDB.
operations_override: Any = None


def load_tokens(tokens_file: Path | None) -> Any:
    """The API tokens from the file, else from ``MSCHEDULER_API_TOKENS`` (CliError if neither)."""
    from mscheduler.web.auth import parse_tokens, read_tokens_file

    try:
        if tokens_file is not None:
            return read_tokens_file(tokens_file)
        text = os.environ.get(TOKENS_ENV, "")
        if not text.strip():
            raise CliError(
                f"no API tokens: set {TOKENS_ENV}='admin:TOKEN,read:TOKEN' or pass --tokens-file "
                f"(tokens of at least 16 characters)",
                exit_code=EXIT_USAGE,
            )
        return parse_tokens(text)
    except InvalidInput as exc:
        raise CliError(str(exc), exit_code=EXIT_USAGE) from None


def quiet_collector(young: int = 20_000) -> None:
    """Keep the garbage collector's pauses short in the server process: what exists once the
    app is ready (modules, the app, its routes: some 100,000 objects that live as long as the
    process) is moved out of its reach (``gc.freeze``), and young collections run after
    ``young`` allocations instead of 700. A full pass over that heap stopped every request for
    about 100 ms a few times a minute under load (benchmarks/README.md, the API under load)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


async def serve(
    *,
    uri: str,
    database: str | None,
    prefix: str,
    host: str,
    port: int,
    tokens: Any,
    server_selection_timeout_ms: int | None,
    metrics_public: bool = False,
    events: bool = False,
    event_retention_days: float = 7.0,
    limits: Any = None,
    server: Any = None,
) -> None:
    """Connect, make sure the indexes exist, and serve until SIGINT / SIGTERM (uvicorn's), under
    ``server`` (``mscheduler.web.serving.ServerSettings``: connections, timeouts)."""
    import uvicorn

    from mscheduler.drivers.mongo.driver import MongoDriver
    from mscheduler.web import create_app
    from mscheduler.web.serving import ServerSettings, uvicorn_config

    client = None
    if operations_override is not None:
        operations = operations_override()
    else:
        client = mongo_client(uri, server_selection_timeout_ms)
        try:
            await ensure_reachable(client, redact(uri), hint=URI_TIMEOUT_HINT)
        except CliError as exc:
            await client.close()
            raise CliError(str(exc), exit_code=EXIT_STORAGE) from exc
        driver = MongoDriver(
            database_of(client, database, "mscheduler"),
            prefix=prefix,
            events=events,
            event_retention=timedelta(days=event_retention_days),
        )
        await driver.prepare()  # the listings name their indexes (hint): `mscheduler setup` made them
        operations = Operations(driver)
    try:
        web_app = create_app(
            operations=operations, tokens=tokens, metrics_public=metrics_public, limits=limits
        )
        settings = server if server is not None else ServerSettings()
        config, _ = uvicorn_config(web_app, settings, host=host, port=port, log_config=None, access_log=True)
        quiet_collector()
        plain_say(
            f"mscheduler web: serving the REST API on http://{host}:{port}/api/v1 and the dashboard on "
            f"http://{host}:{port}/ui/ ; Ctrl+C to stop"
        )
        await uvicorn.Server(config).serve()
    finally:
        if client is not None:
            await client.close()


def _check_web_extra() -> None:
    """Exit 2 naming the extra when the web server's packages are not installed."""
    try:
        import uvicorn  # noqa: F401

        import mscheduler.web  # noqa: F401
    except ImportError as exc:
        raise exit_with(
            CliError(
                f"the REST API needs its extra: pip install 'mscheduler[web]' ({exc})", exit_code=EXIT_USAGE
            )
        ) from None


@app.command(short_help="Serve the REST API and the web dashboard (needs mscheduler[web]).")
def web(
    mongodb_uri: UriOpt,
    host: Annotated[str, typer.Option(metavar="HOST", help="Address to listen on.")] = DEFAULT_HOST,
    port: Annotated[
        int, typer.Option(metavar="PORT", min=1, max=65535, help="Port to listen on.")
    ] = DEFAULT_PORT,
    tokens_file: Annotated[
        Path | None,
        typer.Option(
            "--tokens-file",
            envvar=TOKENS_FILE_ENV,
            metavar="FILE",
            help="API tokens, one 'admin:TOKEN', 'read:TOKEN', 'publish:TOKEN' or 'executor:TOKEN' "
            f"per line (default: ${TOKENS_ENV}).",
        ),
    ] = None,
    metrics_public: Annotated[
        bool, typer.Option("--metrics-public", help="Serve /metrics without a token.")
    ] = False,
    events: Annotated[
        bool, typer.Option("--events", help="The store records events (the /events routes).")
    ] = False,
    event_retention_days: Annotated[
        float, typer.Option(metavar="DAYS", min=0.001, help="With --events: as your workers'.")
    ] = 7.0,
    max_body_mb: Annotated[
        float, typer.Option(metavar="MB", min=0.001, max=1024, help="Refuse larger request bodies (413).")
    ] = 4.0,
    streams_per_token: Annotated[
        int, typer.Option(metavar="N", min=1, help="Event streams one token may hold open (429 beyond).")
    ] = 8,
    streams_total: Annotated[int, typer.Option(metavar="N", min=1, help="Event streams in all.")] = 64,
    waits_per_token: Annotated[
        int, typer.Option(metavar="N", min=1, help="Long-poll leases one token may have waiting.")
    ] = 64,
    waits_total: Annotated[int, typer.Option(metavar="N", min=1, help="Long-poll leases in all.")] = 256,
    max_connections: MaxConnectionsOpt = DEFAULT_MAX_CONNECTIONS,
    header_timeout: HeaderTimeoutOpt = DEFAULT_HEADER_TIMEOUT,
    keep_alive_timeout: KeepAliveTimeoutOpt = DEFAULT_KEEP_ALIVE_TIMEOUT,
    database: DatabaseOpt = None,
    prefix: PrefixOpt = "",
    server_selection_timeout_ms: TimeoutMs = None,
) -> None:
    """Serve the REST API (/api/v1: tasks, plans, workers, stats, health) until SIGINT / SIGTERM.

    Every request but /api/v1/health and /api/v1/openapi.json needs a bearer token: a read token
    may GET, changes need an admin token. Bodies above --max-body-mb are refused (413); event
    streams and long-poll waits beyond their caps per token and in all get a 429. A client must
    send a request's headers within --header-timeout; at most --max-connections are open (one
    more closes the longest idle). Exits 2 on bad arguments or tokens, 3 if MongoDB cannot be
    reached at start.
    """
    _check_web_extra()
    configure_logging(logging.INFO, "text")
    try:
        from mscheduler.web.guards import ApiLimits
        from mscheduler.web.serving import ServerSettings

        try:
            limits = ApiLimits(
                max_body_bytes=int(max_body_mb * 1024 * 1024),
                streams_per_token=streams_per_token,
                streams_total=streams_total,
                waits_per_token=waits_per_token,
                waits_total=waits_total,
            )
            server = ServerSettings(
                max_connections=max_connections,
                header_timeout=header_timeout,
                keep_alive_timeout=keep_alive_timeout,
            )
        except InvalidInput as exc:
            raise CliError(str(exc), exit_code=EXIT_USAGE) from None
        tokens = load_tokens(tokens_file)
        asyncio.run(
            serve(
                uri=mongodb_uri,
                database=database,
                prefix=prefix,
                host=host,
                port=port,
                tokens=tokens,
                server_selection_timeout_ms=server_selection_timeout_ms,
                metrics_public=metrics_public,
                events=events,
                event_retention_days=event_retention_days,
                limits=limits,
                server=server,
            )
        )
    except CliError as exc:
        raise exit_with(exc) from None
    except KeyboardInterrupt:
        raise exit_with(CliError("interrupted while starting", exit_code=130)) from None
