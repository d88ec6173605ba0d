"""The ``mscheduler`` command line (Typer with Rich): the root app and shared options and output
in ``common``, printers in ``render``, one module per command group; ``main`` ties them together.

May import: everything below the surfaces (``mscheduler.web`` for ``mscheduler web`` too).
"""

from mscheduler.cli.main import main

__all__ = ["main"]
