"""The ``mscheduler`` command: ``demo``, ``worker MODULE:ATTR``, ``planner`` and ``check``.

Thin on purpose: each command parses its arguments and calls plain functions (the demo lives in
``mscheduler.demo``; loading consumers and checking a server are plain functions below). Signal
handlers are installed here, by ``worker``, and nowhere in the library.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import re
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from mscheduler import __version__
from mscheduler.domain.exceptions import MSchedulerError
from mscheduler.drivers.base import ChangeStreamUnsupported
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.common import INDEX_NAMES
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.observability.logs import configure_logging
from mscheduler.runtime.consumer import Consumer

DEFAULT_SERVER_SELECTION_MS = 2000
MIN_SERVER_VERSION = (6, 0)
# The indexes MongoDriver.setup() creates (guarded by tests/acceptance/test_check_inprocess.py).
EXPECTED_INDEXES = INDEX_NAMES
CHANGE_STREAM_PROBE_SECONDS = 1.0
TIMEOUT_OPTION = "--server-selection-timeout-ms"

# Plain help (rich_markup_mode=None): rich's boxed panels cut long option names to fit 80 columns.
app = typer.Typer(
    name="mscheduler",
    help="A durable asyncio task scheduler on MongoDB.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)  # messages hold user text
log = logging.getLogger("mscheduler.cli")


class CliError(Exception):
    """A clear message for the user and an exit code; printed without a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _fail(exc: CliError) -> typer.Exit:
    err.print(Text("error: ", style="bold red") + Text(str(exc)))
    return typer.Exit(exc.exit_code)


def _show_version(value: bool) -> None:
    if value:
        out.print(f"mscheduler {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    """A durable asyncio task scheduler on MongoDB."""


def _needs(companion: str, given: dict[str, bool], why: str) -> None:
    """Refuse options that do nothing without ``companion`` (exit 2) rather than ignore them."""
    ignored = [name for name, present in given.items() if present]
    if ignored:
        raise _fail(
            CliError(
                f"{', '.join(ignored)} {'needs' if len(ignored) == 1 else 'need'} {companion} ({why})",
                exit_code=2,
            )
        )


# -- MongoDB connection (demo --mongodb-uri, check, worker start-up) ------------------------------

TimeoutMs = Annotated[
    int | None,
    typer.Option(
        TIMEOUT_OPTION,
        metavar="MS",
        min=1,
        help=f"How long to look for a server at start (default: the URI's, else "
        f"{DEFAULT_SERVER_SELECTION_MS}).",
    ),
]


def redact(uri: str) -> str:
    """The URI without its password, for messages."""
    return re.sub(
        r"^(mongodb(?:\+srv)?://)([^@/]*)@", lambda m: f"{m.group(1)}{m.group(2).split(':')[0]}:***@", uri
    )


def _one_line(text: str, limit: int = 200) -> str:
    """PyMongo's message without its topology dump and timeout details, on one line."""
    text = re.split(r",? Timeout: |,? Topology Description: | \(configured timeouts", text)[0]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _raised_by(exc: BaseException, package: str) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is in ``package``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith(package + ".")


def mongo_setting_error(exc: BaseException) -> str | None:
    """PyMongo's reason when ``exc`` is a malformed URI or client option, else None."""
    from pymongo.errors import ConfigurationError

    if isinstance(exc, ConfigurationError) or (
        isinstance(exc, (ValueError, TypeError, UserWarning)) and _raised_by(exc, "pymongo")
    ):
        return _one_line(str(exc)) or type(exc).__name__
    return None


def mongo_client(uri: str, server_selection_ms: int | None) -> Any:
    """An ``AsyncMongoClient`` that fails fast: ``serverSelectionTimeoutMS`` unless the URI sets it."""
    from pymongo import AsyncMongoClient

    kwargs: dict[str, Any] = {}
    if server_selection_ms is not None:
        kwargs["serverSelectionTimeoutMS"] = server_selection_ms
    elif "serverselectiontimeoutms=" not in uri.lower():
        kwargs["serverSelectionTimeoutMS"] = DEFAULT_SERVER_SELECTION_MS
    try:
        with warnings.catch_warnings():
            # PyMongo only warns about an unknown or invalid URI option, then ignores it; here a
            # mistyped option would silently change what is checked, so it is a usage error.
            warnings.simplefilter("error", UserWarning)
            return AsyncMongoClient(uri, **kwargs)
    except Exception as exc:
        reason = mongo_setting_error(exc)
        if reason is None:
            raise
        raise CliError(f"invalid MongoDB URI {redact(uri)!r}: {reason}", exit_code=2) from exc


def _servers(client: Any) -> str:
    """The client's server addresses (never its credentials)."""
    try:
        addresses = list(client.topology_description.server_descriptions())
    except Exception:  # an exotic client: the message still says the rest
        addresses = []
    return ",".join(f"{host}:{port}" for host, port in addresses) or "the server"


def _why_unreachable(exc: BaseException, client: Any) -> str:
    """The first server's own error ("connection refused"), else PyMongo's first sentence."""
    try:
        descriptions = client.topology_description.server_descriptions().values()
        errors = [str(d.error) for d in descriptions if d.error is not None]
    except Exception:
        errors = []
    reason = _one_line(errors[0] if errors else str(exc), limit=120)
    return reason + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")


async def ensure_reachable(
    client: Any, where: str, *, timeout_ms: int | None = None, hint: str = ""
) -> float:
    """Ping the server; returns the round trip in ms, or raises CliError with a one-line reason.

    ``timeout_ms`` bounds this ping (a client-side operation timeout, ``pymongo.timeout``) however
    long the client's own ``serverSelectionTimeoutMS`` is; ``hint`` says how to wait longer.
    """
    import pymongo
    from pymongo.errors import (
        ExecutionTimeout,
        NetworkTimeout,
        OperationFailure,
        PyMongoError,
        ServerSelectionTimeoutError,
    )

    configured = int(client.options.server_selection_timeout * 1000)
    waited = min(configured, timeout_ms) if timeout_ms is not None else configured
    started = time.perf_counter()
    try:
        with pymongo.timeout(waited / 1000):
            await client.admin.command("ping")
    except ServerSelectionTimeoutError as exc:
        raise CliError(
            f"cannot reach MongoDB at {where}: no server answered within {waited} ms "
            f"({_why_unreachable(exc, client)}); {hint}"
        ) from exc
    except (ExecutionTimeout, NetworkTimeout) as exc:
        raise CliError(
            f"MongoDB at {where} did not answer a ping within {waited} ms "
            f"({_one_line(str(exc), 120)}); {hint}"
        ) from exc
    except OperationFailure as exc:
        raise CliError(f"MongoDB at {where} refused the connection: {_one_line(str(exc))}") from exc
    except PyMongoError as exc:
        raise CliError(f"cannot talk to MongoDB at {where}: {_one_line(str(exc))}") from exc
    return (time.perf_counter() - started) * 1000


URI_TIMEOUT_HINT = f"to wait longer, pass {TIMEOUT_OPTION} or set serverSelectionTimeoutMS in the URI"


def _database(client: Any, name: str | None, fallback: str) -> Any:
    return client[name] if name else client.get_default_database(fallback)


# -- demo -----------------------------------------------------------------------------------------


@app.command(short_help="Run a mixed batch on several consumers and check every outcome.")
def demo(
    mongodb_uri: Annotated[
        str | None,
        typer.Option(metavar="URI", help="Run on this MongoDB server instead of in memory."),
    ] = None,
    database: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="Database for --mongodb-uri (default: the URI's, else mscheduler_demo)."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(metavar="N", min=3, help="Consumers to run.")] = 4,
    quick: Annotated[int, typer.Option(metavar="N", min=0, help="Quick tasks in the batch.")] = 40,
    timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS", min=1, help="Fail if the batch has not ended after this many seconds."
        ),
    ] = 60,
    keep: Annotated[
        bool,
        typer.Option("--keep", help="With --mongodb-uri: keep the demo's collections (dropped by default)."),
    ] = False,
    server_selection_timeout_ms: TimeoutMs = None,
) -> None:
    """Publish a mixed batch, run several consumers, and check every task ended as expected.

    Quick tasks, tasks that fail and are retried, one that uses up its retries, a long task kept
    alive by pings, tasks aimed at one worker and a fan-out task for three workers. Exits 1 if any
    check fails, 2 on bad arguments.
    """
    from mscheduler.demo import DemoConfig, DemoReport, report_renderables, run_demo, run_demo_on_database

    if mongodb_uri is None:
        _needs(
            "--mongodb-uri",
            {
                "--database": database is not None,
                "--keep": keep,
                TIMEOUT_OPTION: server_selection_timeout_ms is not None,
            },
            "the demo runs in memory without it",
        )
    config = DemoConfig(workers=workers, quick=quick, timeout=timeout)
    where = "in memory (MemoryDriver)" if mongodb_uri is None else f"on MongoDB {escape(redact(mongodb_uri))}"
    out.print(f"[bold]mscheduler demo[/bold] {where}: {config.workers} workers x {config.concurrency} slots")
    progress = Progress(
        TextColumn("[bold]tasks"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[states]}"),
        TimeElapsedColumn(),
        console=out,
    )
    bar = progress.add_task("tasks", total=None, states="")

    def on_progress(done: int, total: int, counts: dict[str, int]) -> None:
        states = " ".join(f"{state} {n}" for state, n in sorted(counts.items()) if n)
        progress.update(bar, completed=done, total=total, states=states)

    async def on_mongo(uri: str) -> DemoReport:
        client = mongo_client(uri, server_selection_timeout_ms)
        try:
            await ensure_reachable(client, redact(uri), hint=URI_TIMEOUT_HINT)
            db = _database(client, database, "mscheduler_demo")
            with progress:
                report, prefix = await run_demo_on_database(
                    db, config=config, on_progress=on_progress, keep=keep
                )
            if keep:
                out.print(f"kept collections {db.name}.{prefix}*")
            return report
        finally:
            await client.close()

    async def in_memory() -> DemoReport:
        with progress:
            return await run_demo(MemoryDriver(), config=config, on_progress=on_progress)

    try:
        report = asyncio.run(in_memory() if mongodb_uri is None else on_mongo(mongodb_uri))
    except CliError as exc:
        raise _fail(exc) from None
    except MSchedulerError as exc:
        raise _fail(CliError(f"the demo could not run: {_one_line(str(exc), limit=300)}")) from None
    for renderable in report_renderables(report):
        out.print(renderable)
    raise typer.Exit(0 if report.ok else 1)


# -- worker ---------------------------------------------------------------------------------------

TARGET_HELP = "a Consumer, a list of Consumers, or a zero-argument (async) function returning one of those"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


Say = Callable[..., None]


def plain_say(message: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """The worker's own status lines, as text on stderr."""
    err.print(message)


def log_say(message: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """The worker's own status lines as log records (one JSON object each with --log-format json)."""
    log.log(level, message, extra=fields)


def _user_code_failed(what: str, exc: Exception) -> CliError:
    """The user's module or factory raised: a malformed MongoDB URI is a usage error (exit 2, one
    line); anything else shows its traceback (exit 1)."""
    reason = mongo_setting_error(exc)
    if reason is not None:
        return CliError(f"{what} failed: invalid MongoDB URI or client option: {reason}", exit_code=2)
    return CliError(f"{what} failed:\n{_short_traceback(exc)}")


def import_target(spec: str) -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted); the current directory is importable, as with -m."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise CliError(f"expected MODULE:ATTR (e.g. myapp.workers:make_consumers), got {spec!r}", exit_code=2)
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CliError(
                f"cannot import module {module_name!r}: {exc} "
                "(run from your project's directory or set PYTHONPATH)",
                exit_code=2,
            ) from exc
        raise _user_code_failed(f"importing {module_name!r}", exc) from exc
    except Exception as exc:  # the user's module failed while importing
        raise _user_code_failed(f"importing {module_name!r}", exc) from exc
    target: Any = module
    walked = module_name
    for part in attr.split("."):
        if not hasattr(target, part):
            raise CliError(f"{walked!r} has no attribute {part!r} (looked up {spec!r})", exit_code=2)
        target = getattr(target, part)
        walked = f"{walked}:{part}" if walked == module_name else f"{walked}.{part}"
    return target


def _short_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc, limit=-6)).rstrip()


def _as_consumers(value: Any, spec: str, what: str) -> list[Consumer]:
    if isinstance(value, Consumer):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, Consumer) for c in value):
        ids = [c.worker_id for c in value]
        if len(set(ids)) != len(ids):
            raise CliError(f"{spec} {what} consumers with the same worker_id: {ids}", exit_code=2)
        return list(value)
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(c).__name__ for c in value}) or ["nothing"]
        raise CliError(f"{spec} {what} a list of {', '.join(kinds)}; expected {TARGET_HELP}", exit_code=2)
    raise CliError(f"{spec} {what} of type {type(value).__name__}; expected {TARGET_HELP}", exit_code=2)


async def resolve_consumers(target: Any, spec: str) -> list[Consumer]:
    """Turn the imported object into consumers, calling (and awaiting) a factory on this loop."""
    if isinstance(target, (Consumer, list, tuple)):
        return _as_consumers(target, spec, "is")
    if inspect.isclass(target) or not callable(target):
        return _as_consumers(target, spec, "is")
    try:
        inspect.signature(target).bind()
    except TypeError as exc:
        raise CliError(f"{spec} must take no arguments to be used as a factory ({exc})", exit_code=2) from exc
    except ValueError:
        pass  # no signature to inspect (a builtin): just call it
    try:
        value = target()
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:  # the user's factory failed
        if exc.__traceback__ is not None and exc.__traceback__.tb_frame.f_code is resolve_consumers.__code__:
            exc = exc.with_traceback(exc.__traceback__.tb_next)  # start at the user's code
        raise _user_code_failed(f"calling {spec}()", exc) from exc
    return _as_consumers(value, spec, "returned")


async def ensure_consumers_reach_mongodb(consumers: list[Consumer], timeout_ms: int) -> None:
    """Ping each distinct PyMongo client behind the consumers, within ``timeout_ms``.

    Without it, a consumer's start on an unreachable server waits out the client's server
    selection (30 s by default) on every one of the driver's retries: minutes, not seconds.
    """
    from pymongo import AsyncMongoClient

    seen: set[int] = set()
    for consumer in consumers:
        driver = consumer.driver
        client = getattr(driver.database, "client", None) if isinstance(driver, MongoDriver) else None
        if not isinstance(client, AsyncMongoClient) or id(client) in seen:
            continue  # the memory driver, mongomock, or a client already checked
        seen.add(id(client))
        await ensure_reachable(
            client,
            f"{_servers(client)} (consumer {consumer.worker_id})",
            timeout_ms=timeout_ms,
            hint=f"to wait longer, pass {TIMEOUT_OPTION}",
        )


def _worker_metrics(consumers: list[Consumer], port: int, say: Say) -> Any:
    """``--metrics-port``: serve the consumers' metrics (mscheduler.metrics) before they start."""
    try:
        from mscheduler.observability.metrics import serve_worker_metrics
    except ImportError as exc:
        hint = "--metrics-port needs prometheus-client: pip install 'mscheduler[metrics]'"
        raise CliError(hint, exit_code=2) from exc
    try:
        metrics, bound = serve_worker_metrics(consumers, port)
    except OSError as exc:
        raise CliError(f"cannot serve metrics on port {port}: {exc.strerror or exc}") from exc
    say(f"mscheduler worker: metrics on http://0.0.0.0:{bound}/metrics", metrics_port=bound)
    return metrics


async def run_workers(
    spec: str,
    *,
    grace: float | None = None,
    server_selection_timeout_ms: int = DEFAULT_SERVER_SELECTION_MS,
    say: Say = plain_say,
    metrics_port: int | None = None,
) -> int:
    """Run the consumers named by ``spec`` until SIGINT / SIGTERM; a second signal stops at once.

    Returns the exit code: 0 after a requested stop, 1 if a consumer died on its own.
    """
    consumers = await resolve_consumers(import_target(spec), spec)
    await ensure_consumers_reach_mongodb(consumers, server_selection_timeout_ms)
    metrics = _worker_metrics(consumers, metrics_port, say) if metrics_port is not None else None
    started: list[Consumer] = []
    try:
        for consumer in consumers:
            await consumer.start()
            started.append(consumer)
    except MSchedulerError as exc:
        await asyncio.gather(*(c.stop(grace=0) for c in started), return_exceptions=True)
        if metrics is not None:
            metrics.close()
        raise CliError(f"consumer {consumer.worker_id} could not start: {_one_line(str(exc), 300)}") from exc

    loop = asyncio.get_running_loop()
    signals = 0
    stops: list[asyncio.Future[None]] = []
    shown_grace = f"{grace:g}s" if grace is not None else f"up to {max(c.grace_period for c in consumers):g}s"

    def stop_all(how: float | None) -> None:
        stops.extend(asyncio.ensure_future(c.stop(grace=how)) for c in consumers)

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        name = signal.Signals(signum).name
        if signals == 1:
            say(
                f"received {name}: stopping gracefully (running handlers may finish, {shown_grace}); "
                f"send {name} again to stop now",
                signal=name,
            )
            stop_all(grace)
        else:
            say(
                f"received {name} again: stopping now (cancelling running handlers, releasing their leases)",
                level=logging.WARNING,
                signal=name,
            )
            stop_all(0)

    handled = (signal.SIGINT, signal.SIGTERM)
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    ids = [c.worker_id for c in consumers]
    say(
        f"mscheduler worker: started {len(consumers)} consumer(s) [{', '.join(ids)}]; Ctrl+C to stop",
        worker_ids=ids,
    )
    try:
        waiting = {asyncio.ensure_future(c.wait_stopped()): c for c in consumers}
        pending = set(waiting)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            crashed = [waiting[d] for d in done if waiting[d].error is not None]
            if crashed and not stops:
                for c in crashed:
                    say(
                        f"consumer {c.worker_id} stopped on an error: {c.error!r}; stopping the others",
                        level=logging.ERROR,
                        worker_id=c.worker_id,
                    )
                stop_all(grace)
        await asyncio.gather(*stops, return_exceptions=True)
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        if metrics is not None:
            metrics.close()
    failed = [c for c in consumers if c.error is not None]
    for c in failed:
        say(f"consumer {c.worker_id} failed: {c.error!r}", level=logging.ERROR, worker_id=c.worker_id)
    say(f"mscheduler worker: stopped {len(consumers)} consumer(s)", worker_ids=ids)
    return 1 if failed else 0


@app.command(short_help="Run your consumers until SIGINT / SIGTERM.")
def worker(
    # described in the docstring: an argument's help line would show its type as "<str>"
    target: Annotated[str, typer.Argument(metavar="MODULE:ATTR", hidden=True)],
    grace: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            min=0,
            help="Seconds running handlers get on stop (default: each consumer's grace_period).",
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(metavar="LEVEL", help="Logging level: DEBUG, INFO, WARNING, ERROR.")
    ] = "INFO",
    log_format: Annotated[
        LogFormat,
        typer.Option(help="text, or json: one JSON object per line with every structured field."),
    ] = LogFormat.TEXT,
    server_selection_timeout_ms: Annotated[
        int,
        typer.Option(
            TIMEOUT_OPTION,
            metavar="MS",
            min=1,
            help="How long start-up waits for the consumers' MongoDB server.",
        ),
    ] = DEFAULT_SERVER_SELECTION_MS,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            metavar="PORT",
            min=0,
            max=65535,
            help="Serve Prometheus metrics at :PORT/metrics (needs mscheduler[metrics]).",
        ),
    ] = None,
) -> None:
    """Run consumers from your module until SIGINT / SIGTERM (a second signal stops at once).

    MODULE:ATTR (e.g. myapp.worker:make_consumers) names a Consumer, a list of Consumers, or a
    zero-argument function, plain or async, returning one of those. Exits 0 after a requested
    stop, 1 if a consumer failed, 2 on bad arguments.
    """
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise _fail(CliError(f"unknown log level {log_level!r}", exit_code=2))
    configure_logging(level, log_format.value)
    say = log_say if log_format is LogFormat.JSON else plain_say
    try:
        code = asyncio.run(
            run_workers(
                target,
                grace=grace,
                server_selection_timeout_ms=server_selection_timeout_ms,
                say=say,
                metrics_port=metrics_port,
            )
        )
    except CliError as exc:
        if log_format is LogFormat.JSON:
            log.error("error: %s", exc, extra={"exit_code": exc.exit_code})
            raise typer.Exit(exc.exit_code) from None
        raise _fail(exc) from None
    except KeyboardInterrupt:  # Ctrl+C before the consumers were up (their handlers not installed)
        raise _fail(CliError("interrupted while starting", exit_code=130)) from None
    raise typer.Exit(code)


# -- planner --------------------------------------------------------------------------------------


async def run_planner(
    uri: str,
    *,
    database: str | None = None,
    interval: float = 1.0,
    server_selection_timeout_ms: int | None = None,
    say: Say = plain_say,
) -> int:
    """Run a planner on the server at ``uri`` until SIGINT / SIGTERM; returns the exit code.

    Any number may run beside consumers' planners: occurrences are never made twice."""
    from mscheduler.domain.clock import ServerClock
    from mscheduler.services.planner import Planner

    client = mongo_client(uri, server_selection_timeout_ms)
    try:
        await ensure_reachable(client, redact(uri), hint=URI_TIMEOUT_HINT)
        driver = MongoDriver(_database(client, database, "mscheduler"))
        await driver.setup()
        clock = ServerClock()
        await clock.sync(driver.server_time)
        planner = Planner(driver, clock=clock, interval=interval)
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            say(
                f"received {signal.Signals(signum).name}: stopping the planner",
                signal=signal.Signals(signum).name,
            )
            planner.stop()

        handled = (signal.SIGINT, signal.SIGTERM)
        for signum in handled:
            loop.add_signal_handler(signum, on_signal, signum)
        say(f"mscheduler planner: started on {driver.namespace} (every {interval:g}s); Ctrl+C to stop")
        try:
            await planner.run()
        except MSchedulerError as exc:
            say(f"planner stopped on an error: {exc}", level=logging.ERROR)
            return 1
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)
        say(f"mscheduler planner: stopped ({planner.materialised} occurrence(s) made)")
        return 0
    finally:
        await client.close()


@app.command(short_help="Materialise recurring plans' occurrences until SIGINT / SIGTERM.")
def planner(
    mongodb_uri: Annotated[str, typer.Option(metavar="URI", help="The scheduler's MongoDB server.")],
    database: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="Database the scheduler uses (default: the URI's, else mscheduler)."
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option(metavar="SECONDS", min=0.01, max=3600, help="Seconds between passes.")
    ] = 1.0,
    server_selection_timeout_ms: TimeoutMs = None,
) -> None:
    """Run a planner: turn due occurrences of recurring plans into tasks.

    Consumers may run one each too; any number of planners may run at once (an occurrence's task
    key is derived from the plan and the fire time, so none is made twice). Exits 0 after a
    requested stop, 1 on an error, 2 on bad arguments.
    """
    configure_logging(logging.INFO, "text")
    try:
        code = asyncio.run(
            run_planner(
                mongodb_uri,
                database=database,
                interval=interval,
                server_selection_timeout_ms=server_selection_timeout_ms,
            )
        )
    except CliError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        raise _fail(CliError("interrupted while starting", exit_code=130)) from None
    raise typer.Exit(code)


# -- check ----------------------------------------------------------------------------------------

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(slots=True)
class CheckLine:
    name: str
    level: str  # ok / warn / fail
    detail: str


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


async def probe_change_stream(
    driver: MongoDriver, seconds: float = CHANGE_STREAM_PROBE_SECONDS
) -> str | None:
    """Open a change stream through the driver; None if it opened, else why not."""
    stream = driver.watch(["mscheduler.check"])
    try:
        await asyncio.wait_for(anext(stream), seconds)
    except TimeoutError:
        return None  # opened and waited for events: supported
    except StopAsyncIteration:
        return None
    except ChangeStreamUnsupported as exc:
        return str(exc)
    except MSchedulerError as exc:
        return f"error: {exc}"
    finally:
        await stream.aclose()
    return None


async def check_server(database: Any, *, prefix: str = "", create_indexes: bool = False) -> list[CheckLine]:
    """What ``mscheduler check`` reports after connecting: version, replica set, streams, indexes."""
    driver = MongoDriver(database, prefix=prefix)
    info = await driver.server_info()
    lines: list[CheckLine] = []
    version = info.get("version")
    if version:
        too_old = _version_tuple(version) < MIN_SERVER_VERSION
        need = ".".join(map(str, MIN_SERVER_VERSION))
        lines.append(
            CheckLine(
                "server version",
                FAIL if too_old else OK,
                f"{version}" + (f" (need >= {need})" if too_old else ""),
            )
        )
    else:
        lines.append(
            CheckLine("server version", WARN, f"unknown ({info.get('version_error', 'no buildInfo')})")
        )

    if "hello_error" in info:
        lines.append(
            CheckLine("replica set", WARN, f"could not ask the server (hello failed: {info['hello_error']})")
        )
    elif info.get("replica_set"):
        primary = info.get("is_primary")
        lines.append(
            CheckLine(
                "replica set",
                OK if primary else FAIL,
                f"{info['replica_set']}, "
                + (
                    "connected to the primary; transactions available"
                    if primary
                    else "not connected to a primary (writes will fail)"
                ),
            )
        )
    else:
        lines.append(
            CheckLine(
                "replica set",
                WARN,
                "none (standalone server or mongos): transactions (send(session=...)) need a replica set",
            )
        )

    reason = await probe_change_stream(driver)
    if reason is None:
        lines.append(CheckLine("change streams", OK, "supported: consumers are told about new tasks at once"))
    else:
        lines.append(
            CheckLine("change streams", WARN, f"unavailable ({reason}); consumers fall back to polling")
        )

    collection = driver.namespace
    try:
        present = set(await driver.index_names())
        missing = [name for name in EXPECTED_INDEXES if name not in present]
        if missing and create_indexes:
            await driver.setup()
            present = set(await driver.index_names())
            still = [name for name in EXPECTED_INDEXES if name not in present]
            lines.append(
                CheckLine(
                    "indexes",
                    FAIL if still else OK,
                    f"created {', '.join(missing)} on {collection}"
                    + (f"; still missing {', '.join(still)}" if still else ""),
                )
            )
        elif missing:
            lines.append(
                CheckLine(
                    "indexes",
                    WARN,
                    f"missing on {collection}: {', '.join(missing)} "
                    "(run with --create-indexes; consumers and publishers also create them on first use)",
                )
            )
        else:
            lines.append(CheckLine("indexes", OK, f"all {len(EXPECTED_INDEXES)} present on {collection}"))
    except Exception as exc:  # a report: every failure is information
        lines.append(CheckLine("indexes", FAIL, f"could not read or create indexes on {collection}: {exc}"))
    return lines


@app.command(short_help="Check that a MongoDB server is ready for the scheduler.")
def check(
    mongodb_uri: Annotated[
        str,
        typer.Option(
            metavar="URI", help="The server to check, e.g. mongodb://localhost:27017/?replicaSet=rs0"
        ),
    ],
    database: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="Database the scheduler uses (default: the URI's, else mscheduler)."
        ),
    ] = None,
    prefix: Annotated[
        str, typer.Option(metavar="PREFIX", help="Collection prefix (MongoDriver(prefix=...)).")
    ] = "",
    create_indexes: Annotated[bool, typer.Option("--create-indexes", help="Create missing indexes.")] = False,
    server_selection_timeout_ms: TimeoutMs = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Warnings (no replica set, missing indexes) fail too.")
    ] = False,
) -> None:
    """Check a MongoDB server: connectivity, version, replica set, change streams, indexes.

    Exits 1 if something is broken (or, with --strict, merely not ready), 2 on bad arguments.
    """

    async def run() -> tuple[float, list[CheckLine], str]:
        client = mongo_client(mongodb_uri, server_selection_timeout_ms)
        try:
            rtt = await ensure_reachable(client, redact(mongodb_uri), hint=URI_TIMEOUT_HINT)
            db = _database(client, database, "mscheduler")
            return rtt, await check_server(db, prefix=prefix, create_indexes=create_indexes), db.name
        finally:
            await client.close()

    try:
        rtt, lines, db_name = asyncio.run(run())
    except CliError as exc:
        raise _fail(exc) from None
    except MSchedulerError as exc:
        raise _fail(CliError(f"the check could not run: {_one_line(str(exc), limit=300)}")) from None
    lines.insert(
        0, CheckLine("connection", OK, f"{redact(mongodb_uri)} answered in {rtt:.0f} ms (database {db_name})")
    )
    styles = {OK: "green", WARN: "yellow", FAIL: "bold red"}
    table = Table(title="mscheduler check")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for line in lines:
        table.add_row(line.name, Text(line.level.upper(), style=styles[line.level]), line.detail)
    out.print(table)
    failing = [line for line in lines if line.level == FAIL or (strict and line.level == WARN)]
    if failing:
        out.print(Text(f"unhealthy: {', '.join(line.name for line in failing)}", style="bold red"))
        raise typer.Exit(1)
    warned = [line.name for line in lines if line.level == WARN]
    out.print(Text("healthy" + (f" (warnings: {', '.join(warned)})" if warned else ""), style="bold green"))


def main() -> None:
    """Console-script entry point (``mscheduler``, ``python -m mscheduler``)."""
    app(prog_name="mscheduler")


# -- operator commands (mscheduler.cli_ops: tasks, plans, workers, stats) -------------------------

from mscheduler import cli_ops  # noqa: E402, F401  (imported last: it registers its commands on app)
