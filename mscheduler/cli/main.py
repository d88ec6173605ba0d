"""The ``mscheduler`` command: the root Typer app (``cli.common``) with every command group.

Each group module registers its commands on import; this module imports them once, in the order
``mscheduler --help`` lists them, and none of them imports another command module. Signal
handlers are installed by ``worker``, ``planner``, ``maintenance`` and ``web``, and nowhere in
the library.
"""

from __future__ import annotations

from typing import Annotated

import typer

from mscheduler.cli.common import app, out

# Each group registers its commands on ``app`` when imported, in the order ``--help`` lists them.
from mscheduler.cli import demo, dev, worker, check  # noqa: F401  # isort: skip
from mscheduler.cli import tasks, plans, workers, stats, limits  # noqa: F401  # isort: skip
from mscheduler.cli import maintenance, events, web  # noqa: F401  # isort: skip
from mscheduler.domain.version import __version__


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


def main() -> None:
    """Console-script entry point (``mscheduler``, ``python -m mscheduler``)."""
    app(prog_name="mscheduler")
