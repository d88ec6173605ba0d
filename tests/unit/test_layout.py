"""The package's shape (docs/design.md, "Map of the code"): the layers hold (import-linter), the
tree stays small at the top, every subpackage says what it may import, the import paths the docs
show work, and the paths the package had before it was split still import (with a warning)."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import mscheduler

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "mscheduler"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
SUBPACKAGES = ("cli", "domain", "drivers", "observability", "remote", "runtime", "services", "testing", "web")


def _doc_imports() -> list[str]:
    """Every ``import mscheduler...`` / ``from mscheduler... import ...`` statement in a Python
    block of README.md and docs/*.md (multi-line imports joined)."""
    found = []
    for path in DOCS:
        for block in re.findall(r"```python\n(.*?)```", path.read_text(), re.S):
            try:
                tree = ast.parse(block)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mscheduler"):
                    found.append(ast.unparse(node))
                elif isinstance(node, ast.Import) and any(
                    a.name.startswith("mscheduler") for a in node.names
                ):
                    found.append(ast.unparse(node))
    return sorted(set(found))


def test_the_docs_show_imports() -> None:
    assert len(_doc_imports()) >= 10


@pytest.mark.parametrize("statement", _doc_imports())
def test_every_import_the_docs_show_works_without_a_warning(statement: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a moved (deprecated) path in the docs fails here
        exec(statement, {})


def test_the_top_level_is_small_and_shows_the_layers() -> None:
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    # the subpackages, operations.py and publishing.py (a layer each), __init__, __main__, py.typed
    assert len(entries) <= 14, entries
    for name in SUBPACKAGES:
        assert (PACKAGE / name / "__init__.py").exists(), name


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_every_subpackage_says_what_it_holds_and_may_import(name: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
    assert doc and "May import" in doc, name


def _old_paths() -> list[tuple[str, str]]:
    return sorted(mscheduler._MOVED.items())


def test_old_paths_are_listed() -> None:
    old = dict(_old_paths())
    assert old["mscheduler.schedule"] == "mscheduler.domain.schedule"
    assert old["mscheduler.consumer.runner"] == "mscheduler.runtime.consumer.runner"
    for new in old.values():
        assert (PACKAGE.parent / (new.replace(".", "/") + ".py")).exists() or (
            PACKAGE.parent / new.replace(".", "/") / "__init__.py"
        ).exists(), new


OLD_PATH_CHECK = """
import importlib, json, sys, warnings
seen = {}
for old, new in json.loads(sys.argv[1]):
    module = importlib.import_module(new)
    with warnings.catch_warnings():  # an old parent package warns of itself first
        warnings.simplefilter("ignore")
        importlib.import_module(old.rpartition(".")[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = importlib.import_module(old)
    assert got is module is sys.modules[old], old
    seen[old] = [str(w.message) for w in caught if w.category is DeprecationWarning]
print(json.dumps(seen))
"""


def test_every_old_path_gives_the_moved_module_with_a_deprecation_warning() -> None:
    # in a fresh interpreter: the module objects must be the very same, and nothing cached helps
    pairs = _old_paths()
    done = subprocess.run(
        [sys.executable, "-c", OLD_PATH_CHECK, json.dumps(pairs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    for old, new in pairs:
        assert any(m.startswith(f"{old} moved to {new};") for m in seen[old]), (old, seen[old])


def test_a_name_imported_from_an_old_path_is_the_same_object() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mscheduler.retry import ExponentialRetry  # type: ignore[import-not-found]
    assert ExponentialRetry is importlib.import_module("mscheduler").ExponentialRetry


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (the dev extra)")
def test_the_import_contracts_hold() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (the dev extra)")
@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # the domain reaching up to a driver: the layers and the pure-domain contract both say no
        (
            "domain/limits.py",
            "import mscheduler.drivers.base\n",
            "mscheduler.domain is not allowed to import",
        ),
        # a deferred import from a lower layer back up (a cycle too)
        (
            "drivers/memory/driver.py",
            "def _late() -> None:\n    import mscheduler.runtime.publisher  # noqa: F401\n",
            "mscheduler.drivers is not allowed to import mscheduler.runtime",
        ),
        # two command groups importing each other
        (
            "cli/plans.py",
            "import mscheduler.cli.tasks  # noqa: F401\n",
            "No cycles are allowed in mscheduler.cli",
        ),
    ],
)
def test_a_deliberate_violation_breaks_the_contracts(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    shutil.copytree(PACKAGE, tmp_path / "mscheduler", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "mscheduler" / module
    target.write_text(target.read_text() + "\n" + line)
    if module == "cli/plans.py":  # the other half of the cycle
        tasks = tmp_path / "mscheduler" / "cli" / "tasks.py"
        tasks.write_text(tasks.read_text() + "\nimport mscheduler.cli.plans\n")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout
    assert broken in done.stdout.replace("\n", " "), done.stdout
