"""The command line's root is light: ``mscheduler --version`` and ``--help`` answer without
importing the scheduler, PyMongo, pydantic or httpx (each command's module is imported when that
command runs), and the root's table of commands says what the modules define."""

from __future__ import annotations

import json
import subprocess
import sys

import typer

from mscheduler.cli.main import COMMANDS, full_app
from tests.acceptance.support import REPO, environment

HEAVY = ("pymongo", "pydantic", "httpx", "rich", "mscheduler.operations", "mscheduler.cli.common")


def test_the_root_table_lists_every_command_with_its_own_help() -> None:
    group = typer.main.get_group(full_app())
    defined = {name: command.get_short_help_str(limit=300) for name, command in group.commands.items()}
    # the same commands (the full app's order is its modules' import order; --help lists COMMANDS')
    assert sorted(name for name, _, _ in COMMANDS) == sorted(defined)
    for name, module, help in COMMANDS:
        assert help == defined[name], name
        callback = group.commands[name].callback
        if callback is not None:  # a group's callback is typer's own; a command's is its module's
            assert callback.__module__ in (f"mscheduler.cli.{module}", "typer.main"), name


def _loaded_after(*args: str) -> tuple[str, list[str]]:
    probe = (
        "import sys, json\n"
        "from mscheduler.cli.main import main\n"
        "try:\n"
        f"    main({list(args)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=environment(), capture_output=True, text=True, check=True
    )
    *shown, loaded = done.stdout.splitlines()
    return "\n".join(shown), json.loads(loaded)


def test_version_and_help_import_none_of_the_scheduler() -> None:
    shown, loaded = _loaded_after("--version")
    assert shown.startswith("mscheduler ") and loaded == []
    shown, loaded = _loaded_after("--help")
    assert "Commands:" in shown and "tasks" in shown and loaded == []
    for name, _, help in COMMANDS:
        assert name in shown and help.split()[0] in shown


def test_a_command_still_loads_what_it_needs() -> None:
    shown, loaded = _loaded_after("tasks", "--help")
    assert "send" in shown and "mscheduler.cli.common" in loaded
