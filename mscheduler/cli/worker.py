"""``mscheduler worker MODULE:ATTR`` runs your consumers until SIGINT / SIGTERM, and ``mscheduler
planner`` materialises recurring plans' occurrences; loading consumers from a target and running
them are plain functions here. Signal handlers are installed by these commands only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from mscheduler.cli.common import (
    DEFAULT_SERVER_SELECTION_MS,
    TIMEOUT_OPTION,
    URI_TIMEOUT_HINT,
    CliError,
    DatabaseOpt,
    LogFormat,
    PrefixOpt,
    Say,
    TimeoutMs,
    app,
    database_of,
    ensure_reachable,
    exit_with,
    import_target,
    log,
    log_say,
    mongo_client,
    one_line,
    plain_say,
    redact,
    server_addresses,
    user_code_failed,
)
from mscheduler.domain.exceptions import InvalidInput, MSchedulerError
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.observability.logs import configure_logging
from mscheduler.operations import Operations
from mscheduler.runtime.app import App
from mscheduler.runtime.consumer import Consumer

TARGET_HELP = (
    "an mscheduler.App, a Consumer, a list of Consumers, or a zero-argument (async) function "
    "returning one of those"
)


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
        raise user_code_failed(f"calling {spec}()", exc) from exc
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
            f"{server_addresses(client)} (consumer {consumer.worker_id})",
            timeout_ms=timeout_ms,
            hint=f"to wait longer, pass {TIMEOUT_OPTION}",
        )


def _worker_metrics(consumers: list[Consumer], port: int, say: Say) -> Any:
    """``--metrics-port``: serve the consumers' metrics (``observability.metrics``) before they start."""
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


@dataclass(slots=True, frozen=True)
class Store:
    """Where an ``App``'s consumers keep their tasks (``--mongodb-uri``, ``--database``, ``--prefix``)."""

    uri: str | None = None
    database: str | None = None
    prefix: str = ""
    given: bool = False  # on the command line (not from the environment)


async def app_consumers(app: App, spec: str, store: Store, timeout_ms: int) -> tuple[list[Consumer], Any]:
    """An ``App``'s consumers on the MongoDB store (the client, to close at the end)."""
    if store.uri is None:
        raise CliError(
            f"{spec} is an App: give its store with --mongodb-uri URI (or MSCHEDULER_MONGODB_URI); "
            "to try it without MongoDB: mscheduler dev " + spec,
            exit_code=2,
        )
    client = mongo_client(store.uri, timeout_ms)
    try:
        await ensure_reachable(client, redact(store.uri), timeout_ms=timeout_ms, hint=URI_TIMEOUT_HINT)
        driver = MongoDriver(database_of(client, store.database, "mscheduler"), prefix=store.prefix)
        return app.consumers(driver), client
    except InvalidInput as exc:
        await client.close()
        raise CliError(f"{spec}: {exc}", exit_code=2) from exc
    except BaseException:
        await client.close()
        raise


async def run_workers(
    spec: str,
    *,
    grace: float | None = None,
    server_selection_timeout_ms: int = DEFAULT_SERVER_SELECTION_MS,
    say: Say = plain_say,
    metrics_port: int | None = None,
    store: Store | None = None,
) -> int:
    """Run the consumers named by ``spec`` until SIGINT / SIGTERM; a second signal stops at once.
    An ``App``'s consumers run on the MongoDB store ``store`` names.

    Returns the exit code: 0 after a requested stop, 1 if a consumer died on its own.
    """
    store = store or Store()
    target = import_target(spec)
    client = None
    if isinstance(target, App):
        consumers, client = await app_consumers(target, spec, store, server_selection_timeout_ms)
    else:
        if store.given:
            raise CliError(
                f"{spec} builds its own store: --mongodb-uri, --database and --prefix are for an App",
                exit_code=2,
            )
        consumers = await resolve_consumers(target, spec)
    try:
        return await _run_consumers(consumers, target, grace, server_selection_timeout_ms, say, metrics_port)
    finally:
        if client is not None:
            await client.close()


async def _start_all(consumers: list[Consumer], metrics: Any) -> None:
    """Start every consumer; if one cannot start, stop those that did (and the metrics server)."""
    started: list[Consumer] = []
    try:
        for consumer in consumers:
            await consumer.start()
            started.append(consumer)
    except MSchedulerError as exc:
        await asyncio.gather(*(c.stop(grace=0) for c in started), return_exceptions=True)
        if metrics is not None:
            metrics.close()
        raise CliError(f"consumer {consumer.worker_id} could not start: {one_line(str(exc), 300)}") from exc


async def _run_consumers(
    consumers: list[Consumer],
    target: Any,
    grace: float | None,
    server_selection_timeout_ms: int,
    say: Say,
    metrics_port: int | None,
) -> int:
    await ensure_consumers_reach_mongodb(consumers, server_selection_timeout_ms)
    metrics = _worker_metrics(consumers, metrics_port, say) if metrics_port is not None else None
    await _start_all(consumers, metrics)
    if isinstance(target, App) and target.plans:
        created = await target.add_plans(Operations(consumers[0].driver))
        if created:
            say(f"mscheduler worker: created plan(s) {', '.join(created)}", plans=created)

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
    mongodb_uri: Annotated[
        str | None,
        typer.Option(metavar="URI", help="An App's MongoDB server (or MSCHEDULER_MONGODB_URI)."),
    ] = None,
    database: DatabaseOpt = None,
    prefix: PrefixOpt = "",
) -> None:
    """Run consumers from your module until SIGINT / SIGTERM (a second signal stops at once).

    MODULE:ATTR (e.g. myapp.worker:app) names an mscheduler.App (its consumers run on the
    MongoDB server of --mongodb-uri or MSCHEDULER_MONGODB_URI), a Consumer, a list of Consumers,
    or a zero-argument function, plain or async, returning one of those. Exits 0 after a
    requested stop, 1 if a consumer failed, 2 on bad arguments.
    """
    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise exit_with(CliError(f"unknown log level {log_level!r}", exit_code=2))
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
                store=Store(
                    mongodb_uri or os.environ.get("MSCHEDULER_MONGODB_URI") or None,
                    database,
                    prefix,
                    given=mongodb_uri is not None or database is not None or prefix != "",
                ),
            )
        )
    except CliError as exc:
        if log_format is LogFormat.JSON:
            log.error("error: %s", exc, extra={"exit_code": exc.exit_code})
            raise typer.Exit(exc.exit_code) from None
        raise exit_with(exc) from None
    except KeyboardInterrupt:  # Ctrl+C before the consumers were up (their handlers not installed)
        raise exit_with(CliError("interrupted while starting", exit_code=130)) from None
    raise typer.Exit(code)


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
        driver = MongoDriver(database_of(client, database, "mscheduler"))
        await driver.prepare()  # built by `mscheduler setup`: a store without them is refused here
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
        raise exit_with(exc) from None
    except KeyboardInterrupt:
        raise exit_with(CliError("interrupted while starting", exit_code=130)) from None
    raise typer.Exit(code)
