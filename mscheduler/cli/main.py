"""The ``mscheduler`` command: a light root that imports a command's module only when that
command runs, so ``mscheduler --version`` and ``mscheduler --help`` answer without loading
PyMongo, httpx, pydantic or the scheduler (a fraction of a second instead of more than one).

Each group module registers its commands on the Typer app of ``cli.common`` when imported, and
none of them imports another command module. ``COMMANDS`` names, in the order ``mscheduler
--help`` lists them, each command, the module that defines it and its one-line help;
``tests/unit/test_cli_lazy.py`` checks it against the commands the modules define. Signal
handlers are installed by ``worker``, ``planner``, ``maintenance`` and ``web``, and nowhere in
the library.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from mscheduler.domain.version import __version__

# (command, module under mscheduler.cli, short help) in the order ``--help`` lists them
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("demo", "demo", "Run a mixed batch on several consumers and check every outcome."),
    ("dev", "dev", "Run an App with no database: store, consumers, REST API, dashboard."),
    ("worker", "worker", "Run your consumers until SIGINT / SIGTERM."),
    ("planner", "worker", "Materialise recurring plans' occurrences until SIGINT / SIGTERM."),
    ("setup", "setup", "Create the indexes a MongoDB store needs (once, before the workers start)."),
    ("check", "check", "Check that a MongoDB server is ready for the scheduler."),
    ("stats", "stats", "Task statistics: counts, success rates, durations."),
    ("maintenance", "maintenance", "Expiry, planner and retention passes without a consumer (or --once)."),
    ("web", "web", "Serve the REST API and the web dashboard (needs mscheduler[web])."),
    ("tasks", "tasks", "List, show and steer tasks."),
    ("plans", "plans", "List, show and steer recurring plans."),
    ("workers", "workers", "List registered workers and the task names they handle; ask one to stop."),
    ("limits", "limits", "List, show, set and remove flow limits."),
    ("events", "events", "List and follow recorded task events."),
)
_MODULES = {name: module for name, module, _ in COMMANDS}


def full_app() -> typer.Typer:
    """The Typer app with every command registered (all modules imported): what tests invoke."""
    for module in dict.fromkeys(_MODULES.values()):
        importlib.import_module(f"mscheduler.cli.{module}")
    from mscheduler.cli.common import app

    return app


class _LazyRoot(TyperGroup):
    """The root group: lists commands from ``COMMANDS`` and builds one from its module only
    when it is asked for."""

    # ``Any``: click's types, which typer vendors in some versions and imports in others
    def list_commands(self, ctx: Any) -> list[str]:
        return list(_MODULES)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        module = _MODULES.get(cmd_name)
        if module is None:
            return None
        importlib.import_module(f"mscheduler.cli.{module}")
        from mscheduler.cli.common import app

        return typer.main.get_group(app).get_command(ctx, cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help) for name, _, help in COMMANDS])


root = typer.Typer(
    cls=_LazyRoot,
    name="mscheduler",
    help="A durable asyncio task scheduler on MongoDB.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"mscheduler {__version__}")
        raise typer.Exit()


@root.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    """A durable asyncio task scheduler on MongoDB."""


def main(args: Any = None) -> None:
    """Console-script entry point (``mscheduler``, ``python -m mscheduler``)."""
    root(args=args, prog_name="mscheduler")
