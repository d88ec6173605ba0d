"""The ``mscheduler`` command line (Typer with Rich): the root app and shared options and output
in ``common``, printers in ``render``, one module per command group; ``main`` is the light root
that imports a group only when its command runs.

May import: everything below the surfaces (``mscheduler.web`` for ``mscheduler web`` too).
"""


def main() -> None:
    """Console-script entry point (``mscheduler``, ``python -m mscheduler``)."""
    from mscheduler.cli.main import main as run

    run()


__all__ = ["main"]
