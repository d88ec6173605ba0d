"""What every command shares: the root Typer ``app`` and its consoles, ``CliError`` and the exit
codes, the connection — to MongoDB (``Operations``) or to a REST API (``RemoteOperations``, the
same methods), its options declared once by ``@connected``; ``run`` calls one method and turns a
refusal into one line — and the input parsers and options of several groups.

Exit codes of the operator commands: 0 done; 1 refused or not found (``TransitionRefused``,
``UnknownTask``, ``UnknownPlan``, ``UnknownLimit``, no running worker with that id); 2 bad input or
usage (``InvalidInput``, a malformed URI, a bad option); 3 the store or the API unreachable or
failing (``StorageError``, ``ApiUnreachable``); 4 the API refused the token (401 / 403); 5 the
address does not answer as an mscheduler API.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import logging
import os
import re
import sys
import time
import traceback
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args, get_type_hints

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text
from typer.models import ArgumentInfo

from mscheduler.domain.exceptions import (
    InvalidInput,
    MSchedulerError,
    StorageError,
    TransitionRefused,
    UnknownLimit,
    UnknownPlan,
    UnknownTask,
)
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.observability.logs import CONTROL_CHARS, plain_text
from mscheduler.operations import Operations, OperatorApi
from mscheduler.remote.client import ApiRefused, ApiUnreachable, NotAnApi, RemoteEvents, RemoteOperations
from mscheduler.services.events import Events

# What an operator command calls: the store's operations, or the same methods over the REST API.
Ops = OperatorApi

DEFAULT_SERVER_SELECTION_MS = 2000


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


class TerminalConsole(Console):
    """A Rich console that prints every string as plain text: no markup (a worker id ``[/]`` or
    a key ``[link=...]...[/link]`` is shown as typed, never parsed), no emoji codes, and control
    characters replaced (``plain_text``) — in cells, titles and ``Text`` alike. Stored values
    (keys, worker ids, errors, params) are chosen by whoever publishes or executes tasks: the
    operator's terminal must show them, not obey them. Styles come only from ``Text`` objects
    the CLI builds."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs.update(markup=False, emoji=False)
        return super().render_str(plain_text(text), **kwargs)

    def render(self, renderable: Any, options: Any = None) -> Any:
        if isinstance(renderable, Text) and CONTROL_CHARS.search(renderable.plain):
            renderable = renderable.copy()
            renderable.plain = plain_text(renderable.plain)  # same length: the styles stay put
        return super().render(renderable, options)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """Tables never cut a value: in a terminal a long key folds onto a second line rather
        than ending in an ellipsis; in a pipe or a file a table is plain text — a line per row,
        columns padded to their widest value, no borders, nothing wrapped or cut — for
        ``grep``, ``awk`` and narrow screens alike."""
        from rich.table import Table

        if not any(isinstance(o, Table) for o in objects):
            super().print(*objects, **kwargs)
            return
        for obj in objects:
            if not isinstance(obj, Table):
                super().print(obj, **kwargs)
            elif self.is_terminal:
                for column in obj.columns:
                    column.overflow = "fold"
                super().print(obj, **kwargs)
            else:
                for line in plain_table(obj):
                    super().print(Text(line), soft_wrap=True, crop=False)


def plain_table(table: Any) -> list[str]:
    """A Rich ``Table`` as plain lines: its title, its header (if shown) and its rows, columns
    padded to their widest cell and two spaces apart; a cell's line breaks become spaces."""
    from rich.cells import cell_len

    def text(cell: Any) -> str:
        return " ".join(str(cell.plain if isinstance(cell, Text) else cell).split())

    columns = [[text(c.header), *(text(cell) for cell in c.cells)] for c in table.columns]
    if not columns:
        return []
    rows = list(zip(*columns, strict=True))
    if not table.show_header:
        rows = rows[1:]
    widths = [max((cell_len(row[i]) for row in rows), default=0) for i in range(len(columns))]
    lines = [text(table.title)] if table.title else []
    for row in rows:
        cells = [cell + " " * (widths[i] - cell_len(cell)) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return lines


out = TerminalConsole(soft_wrap=True, markup=False, highlight=False, emoji=False)


err = TerminalConsole(stderr=True, soft_wrap=True, markup=False, highlight=False, emoji=False)


log = logging.getLogger("mscheduler.cli")


class CliError(Exception):
    """A clear message for the user and an exit code; printed without a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_with(exc: CliError) -> typer.Exit:
    err.print(Text("error: ", style="bold red") + Text(str(exc)))
    return typer.Exit(exc.exit_code)


def refuse_without(companion: str, given: dict[str, bool], why: str) -> None:
    """Refuse options that do nothing without ``companion`` (exit 2) rather than ignore them."""
    ignored = [name for name, present in given.items() if present]
    if ignored:
        raise exit_with(
            CliError(
                f"{', '.join(ignored)} {'needs' if len(ignored) == 1 else 'need'} {companion} ({why})",
                exit_code=2,
            )
        )


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


def one_line(text: str, limit: int = 200) -> str:
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
        return one_line(str(exc)) or type(exc).__name__
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


def server_addresses(client: Any) -> str:
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
    reason = one_line(errors[0] if errors else str(exc), limit=120)
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
            f"MongoDB at {where} did not answer a ping within {waited} ms ({one_line(str(exc), 120)}); {hint}"
        ) from exc
    except OperationFailure as exc:
        raise CliError(f"MongoDB at {where} refused the connection: {one_line(str(exc))}") from exc
    except PyMongoError as exc:
        raise CliError(f"cannot talk to MongoDB at {where}: {one_line(str(exc))}") from exc
    return (time.perf_counter() - started) * 1000


URI_TIMEOUT_HINT = f"to wait longer, pass {TIMEOUT_OPTION} or set serverSelectionTimeoutMS in the URI"


def user_code_failed(what: str, exc: Exception) -> CliError:
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
        raise user_code_failed(f"importing {module_name!r}", exc) from exc
    except Exception as exc:  # the user's module failed while importing
        raise user_code_failed(f"importing {module_name!r}", exc) from exc
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


def database_of(client: Any, name: str | None, fallback: str) -> Any:
    return client[name] if name else client.get_default_database(fallback)


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


EXIT_REFUSED, EXIT_USAGE, EXIT_STORAGE = 1, 2, 3
EXIT_TOKEN_REFUSED, EXIT_NOT_AN_API = 4, 5  # --api-url: 401 / 403; not an mscheduler API
T = TypeVar("T")


# A hidden testing hook: when set, commands use the Operations it returns instead of connecting
# (tests set it with monkeypatch; it is not part of the command line).
operations_override: Callable[[], Ops] | None = None


def command_group(name: str, help: str) -> typer.Typer:
    return typer.Typer(
        name=name,
        help=help,
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )


EXITS = (
    "Exits 1 if refused or not found, 2 on bad input, 3 if MongoDB or the API cannot be reached or "
    "fails, 4 if the API refuses the token, 5 if --api-url is not an mscheduler API."
)


UriOpt = Annotated[
    str,
    typer.Option(
        "--mongodb-uri",
        envvar="MSCHEDULER_MONGODB_URI",
        metavar="URI",
        help="The scheduler's MongoDB server.",
    ),
]


DatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database",
        envvar="MSCHEDULER_DATABASE",
        metavar="NAME",
        help="Database (default: the URI's, else mscheduler).",
    ),
]


PrefixOpt = Annotated[
    str, typer.Option("--prefix", metavar="PREFIX", help="Collection prefix (MongoDriver(prefix=...)).")
]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


URI_ENV, API_URL_ENV, TOKEN_ENV = "MSCHEDULER_MONGODB_URI", "MSCHEDULER_API_URL", "MSCHEDULER_TOKEN"


# The three options of ``@connected`` read their environment variables in ``_connection`` (not by
# ``envvar=``): which store a command goes to depends on where each value came from.
ApiUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--api-url",
        metavar="URL",
        help=f"Go through this REST API instead of MongoDB, e.g. http://127.0.0.1:8000 (or {API_URL_ENV}).",
    ),
]


TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        metavar="TOKEN",
        help=f"The API token for --api-url (or {TOKEN_ENV}, better: a value here shows in process lists).",
    ),
]


@dataclass(slots=True, frozen=True)
class Connection:
    uri: str | None
    database: str | None = None
    prefix: str = ""
    server_selection_timeout_ms: int | None = None
    api_url: str | None = None
    token: str | None = None


@asynccontextmanager
async def connect(conn: Connection) -> AsyncIterator[Ops]:
    """``Operations`` on the server, failing fast (exit 3) when it cannot be reached; with an API
    URL, ``RemoteOperations`` on it (exit 3, 4 or 5 when it cannot be used)."""
    if operations_override is not None:
        yield operations_override()
        return
    if conn.api_url is not None:
        try:
            remote = RemoteOperations(conn.api_url, conn.token or "")
        except MSchedulerError as exc:
            raise CliError(str(exc), exit_code=EXIT_USAGE) from exc
        async with remote:
            await remote.connect()
            yield remote
        return
    assert conn.uri is not None
    client = mongo_client(conn.uri, conn.server_selection_timeout_ms)
    try:
        try:
            await ensure_reachable(client, redact(conn.uri), hint=URI_TIMEOUT_HINT)
        except CliError as exc:
            raise CliError(str(exc), exit_code=EXIT_STORAGE) from exc
        db = database_of(client, conn.database, "mscheduler")
        yield Operations(MongoDriver(db, prefix=conn.prefix))
    finally:
        await client.close()


# Keyword arguments that ``Operations``' (and the API's) messages name, as the CLI's flags.
CLI_FLAGS = {
    "force": "--force",
    "allow_unknown": "--allow-unknown",
    "stop_running": "--stop-running",
    "reset_finished": "--reset-finished",
}
_KEYWORD_TRUE = re.compile(r"\b(" + "|".join(CLI_FLAGS) + r")\s*=\s*(?:True|true)\b")


_PYTHON_CALLS = {
    "restart_child(..., force=True)": "restart the child by its key (tasks restart KEY/NAME --force)",
    "Operations.restart": "tasks restart",
}


def in_cli_words(message: str) -> str:
    """A refusal's text with the keyword arguments and calls it names as the command line's
    flags and commands (``force=True`` reads ``--force``)."""
    for call, command in _PYTHON_CALLS.items():
        message = message.replace(call, command)
    return _KEYWORD_TRUE.sub(lambda m: CLI_FLAGS[m.group(1)], message)


def refusal(exc: MSchedulerError) -> CliError:
    """The one-line error and exit code of a refusal from ``Operations`` (in the command
    line's words: ``--force``, not ``force=True``)."""
    message = in_cli_words(one_line(str(exc), limit=300))
    if isinstance(exc, ApiUnreachable):
        return CliError(message, exit_code=EXIT_STORAGE)
    if isinstance(exc, ApiRefused):
        return CliError(message, exit_code=EXIT_TOKEN_REFUSED)
    if isinstance(exc, NotAnApi):
        return CliError(message, exit_code=EXIT_NOT_AN_API)
    if isinstance(exc, InvalidInput):
        return CliError(message, exit_code=EXIT_USAGE)
    if isinstance(exc, StorageError):
        return CliError(f"storage error: {message}", exit_code=EXIT_STORAGE)
    if isinstance(exc, (UnknownTask, UnknownPlan, UnknownLimit, TransitionRefused)):
        return CliError(message, exit_code=EXIT_REFUSED)
    return CliError(message, exit_code=EXIT_REFUSED)


def event_log(ops: Ops) -> Events | RemoteEvents:
    """The event log of the store, or of the API's store."""
    if isinstance(ops, RemoteOperations):
        return ops.events
    assert isinstance(ops, Operations)
    return Events(ops.driver)


def run(conn: Connection, body: Callable[[Ops], Awaitable[T]]) -> T:
    """Connect, call ``body`` with the operations, and turn every refusal into one line."""

    async def go() -> T:
        async with connect(conn) as ops:
            return await body(ops)

    try:
        return asyncio.run(go())
    except CliError as exc:
        raise exit_with(exc) from None
    except MSchedulerError as exc:
        raise exit_with(refusal(exc)) from None


_KW = inspect.Parameter.KEYWORD_ONLY


OptionalUriOpt = Annotated[
    str | None,
    typer.Option("--mongodb-uri", metavar="URI", help=f"The scheduler's MongoDB server (or {URI_ENV})."),
]


_URI_PARAM = inspect.Parameter("mongodb_uri", _KW, default=None, annotation=OptionalUriOpt)


_CONNECTION_PARAMS = (
    inspect.Parameter("database", _KW, default=None, annotation=DatabaseOpt),
    inspect.Parameter("prefix", _KW, default="", annotation=PrefixOpt),
    inspect.Parameter("server_selection_timeout_ms", _KW, default=None, annotation=TimeoutMs),
    inspect.Parameter("api_url", _KW, default=None, annotation=ApiUrlOpt),
    inspect.Parameter("token", _KW, default=None, annotation=TokenOpt),
)


def _connection(
    mongodb_uri: str | None,
    database: str | None,
    prefix: str,
    server_selection_timeout_ms: int | None,
    api_url: str | None,
    token: str | None,
) -> Connection:
    """Where the command goes: MongoDB or a REST API; a usage error (exit 2) when it cannot tell.
    The command line wins over the environment; two stores given the same way are refused."""
    if operations_override is not None:  # the testing hook: the store is set up already
        return Connection(mongodb_uri, database, prefix, server_selection_timeout_ms)
    if api_url is not None and mongodb_uri is not None:
        raise exit_with(CliError("give --mongodb-uri or --api-url, not both", exit_code=EXIT_USAGE))
    if api_url is None and mongodb_uri is None:
        mongodb_uri, api_url = os.environ.get(URI_ENV) or None, os.environ.get(API_URL_ENV) or None
        if api_url is not None and mongodb_uri is not None:
            message = f"{URI_ENV} and {API_URL_ENV} are both set: pass --mongodb-uri or --api-url"
            raise exit_with(CliError(message, exit_code=EXIT_USAGE))
    if api_url is None:
        if mongodb_uri is None:
            raise exit_with(
                CliError(
                    f"no store: give --mongodb-uri URI (or {URI_ENV}), or --api-url URL with --token "
                    f"TOKEN (or {API_URL_ENV} and {TOKEN_ENV})",
                    exit_code=EXIT_USAGE,
                )
            )
        refuse_without("--api-url", {"--token": token is not None}, "a token is for the REST API")
        return Connection(mongodb_uri, database, prefix, server_selection_timeout_ms)
    token = token or os.environ.get(TOKEN_ENV) or None
    refuse_without(
        "--mongodb-uri",
        {
            "--database": database is not None,
            "--prefix": prefix != "",
            TIMEOUT_OPTION: server_selection_timeout_ms is not None,
        },
        "with --api-url the API's server chooses its store",
    )
    if not token:
        raise exit_with(CliError("--api-url needs --token TOKEN (or MSCHEDULER_TOKEN)", exit_code=EXIT_USAGE))
    return Connection(None, api_url=api_url, token=token)


def connected(command: Callable[..., None]) -> Callable[..., None]:
    """A command taking ``conn: Connection`` gets the connection options — ``--mongodb-uri``
    (or ``MSCHEDULER_MONGODB_URI``) after its arguments, ``--database``, ``--prefix``,
    ``--server-selection-timeout-ms``, ``--api-url`` and ``--token`` last — declared once, here,
    for every operator command.

    Typer reads a command's parameters from its signature: the wrapper shows the command's own
    (``conn`` left out) with the four options added, and builds the ``Connection`` from them."""
    hints = get_type_hints(command, include_extras=True)
    own = [
        p.replace(kind=_KW, annotation=hints.get(p.name, p.annotation))
        for p in inspect.signature(command).parameters.values()
        if p.name != "conn"
    ]
    arguments = [
        p for p in own if get_args(p.annotation) and isinstance(get_args(p.annotation)[-1], ArgumentInfo)
    ]
    options = [p for p in own if p not in arguments]
    params = [*arguments, _URI_PARAM, *options, *_CONNECTION_PARAMS]

    @functools.wraps(command)
    def wrapper(
        *,
        mongodb_uri: str | None = None,
        database: str | None = None,
        prefix: str = "",
        server_selection_timeout_ms: int | None = None,
        api_url: str | None = None,
        token: str | None = None,
        **kwargs: Any,
    ) -> None:
        where = _connection(mongodb_uri, database, prefix, server_selection_timeout_ms, api_url, token)
        command(conn=where, **kwargs)

    wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return wrapper


def shown_time(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def print_json(value: Any) -> None:
    out.print_json(json.dumps(value, default=str))


def say_done(message: str) -> None:
    out.print(Text(message))


KeyArg = Annotated[str, typer.Argument(metavar="KEY", hidden=True)]


ForceOpt = Annotated[bool, typer.Option("--force", help="Allow it on a task the rule protects.")]


def parse_instant(value: str | None, option: str) -> datetime | None:
    """An ISO-8601 time with its offset (``2030-01-01T00:00:00Z``) from a command-line option."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        message = f"{option}: an ISO-8601 time with its offset, e.g. 2030-01-01T00:00:00Z"
        raise exit_with(CliError(message, exit_code=EXIT_USAGE))
    return parsed


def usage(message: str) -> typer.Exit:
    return exit_with(CliError(one_line(message, limit=300), exit_code=EXIT_USAGE))


def invalid(exc: ValidationError | InvalidInput, what: str) -> typer.Exit:
    """A model's refusal as one line: the first problem, where and why."""
    if isinstance(exc, InvalidInput):  # the domain's models translate their own errors
        return usage(str(exc))
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return usage(f"{what}: {loc + ': ' if loc else ''}{message}{more}")


def read_text(value: str | None, option: str) -> str | None:
    """An option's text as given, or read from a file (``@FILE``) or from stdin (``-``): large
    params do not fit on a command line."""
    if value is None or not (value == "-" or value.startswith("@")):
        return value
    if value == "-":
        return sys.stdin.read()
    path = Path(value[1:]).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise usage(f"{option}: cannot read {str(path)!r}: {reason}") from None


def json_value(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise usage(f"{option}: not JSON ({exc})") from None


def option_fields(
    priority: int | None,
    run_at: str | None,
    deadline: str | None,
    max_retries: int | None,
    retry_delay: float | None,
    workers: list[str] | None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if priority is not None:
        fields["priority"] = priority
    if run_at is not None:
        fields["run_at"] = parse_instant(run_at, "--run-at")
    if deadline is not None:
        fields["deadline"] = parse_instant(deadline, "--deadline")
    if max_retries is not None:
        fields["max_unexpected_retries"] = max_retries
    if retry_delay is not None:
        fields["retry_delay"] = timedelta(seconds=retry_delay)
    if workers:
        fields["specific_worker_ids"] = tuple(workers)
    return fields


PriorityOpt = Annotated[int | None, typer.Option(metavar="N", help="Higher is claimed first.")]


RunAtOpt = Annotated[str | None, typer.Option(metavar="TIME", help="Not claimed before (ISO-8601).")]


DeadlineOpt = Annotated[
    str | None, typer.Option(metavar="TIME", help="Expires if not started by (ISO-8601).")
]


RetriesOpt = Annotated[
    int | None, typer.Option("--max-retries", metavar="N", help="Failures before it fails for good.")
]


RetryDelayOpt = Annotated[float | None, typer.Option(metavar="SECONDS", help="Wait after a failure.")]


WorkerOpt = Annotated[
    list[str] | None,
    typer.Option("--specific-worker", metavar="WORKER_ID", help="Only this worker (repeatable)."),
]
