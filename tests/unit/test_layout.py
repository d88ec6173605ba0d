"""The package's shape (docs/design.md, "Map of the code"): the layers hold (import-linter), the
tree stays small at the top, every subpackage says what it may import, and the import paths the
docs show work."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

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


# A reference to a document outside the repository (the spec's feature ids, the style guide's
# rules, an issue's number) or a dated piece of history, in the package's comments or docstrings.
OUTSIDE_REFERENCE = re.compile(r"SPEC [FG]?\d|STYLE \d|[Ii]ssue \d|\((?:19|20)\d\d-\d\d(?:-\d\d)?\)")


def test_the_package_states_its_rules_without_outside_references() -> None:
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE_REFERENCE.search(line)
    ]
    assert not found, "say the rule itself:\n" + "\n".join(found)


def test_the_outside_reference_check_sees_one() -> None:
    for line in (
        "# one write per ping (SPEC G2)",
        "(STYLE 6)",
        "see issue 18.9",
        "split into layers (2026-11)",
    ):
        assert OUTSIDE_REFERENCE.search(line), line
    assert not OUTSIDE_REFERENCE.search("JSON Schema (draft 2020-12)")
