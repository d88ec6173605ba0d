"""The Makefile's two commands on a fresh clone: ``make demo`` installs the package's
dependencies alone (no development set: no web server, test tools or type checker) and runs the
demo from the checkout, ``make test`` the development set;
``make dist`` builds and checks what would be published. Read from ``make -n`` (what it would
run) in a copy with no venv: nothing is installed here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.acceptance.support import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def would_run(target: str, tmp_path: Path) -> list[str]:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    # not as a sub-make of a `make test` that runs this: its flags and "Entering directory" lines
    env = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    }
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def installs(lines: list[str]) -> list[str]:
    return [
        line.split(" install ", 1)[1]
        for line in lines
        if "pip install" in line and "--upgrade pip" not in line
    ]


def test_make_demo_installs_only_the_packages_dependencies(tmp_path: Path) -> None:
    lines = would_run("demo", tmp_path)
    assert installs(lines) == ["--quiet --disable-pip-version-check -r .venv/demo-requirements.txt"]
    assert lines[-1] == "PYTHONPATH=. .venv/bin/python -m mscheduler demo"
    [listing] = [line for line in lines if "demo-requirements.txt" in line and "tomllib" in line]
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    subprocess.run(["sh", "-c", listing], cwd=tmp_path, check=True)
    wanted = (tmp_path / ".venv" / "demo-requirements.txt").read_text().split()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert wanted == dependencies and not any("dev" in w or "pytest" in w for w in wanted)


def test_make_test_installs_the_development_set(tmp_path: Path) -> None:
    lines = would_run("test", tmp_path)
    assert installs(lines) == ["--quiet -e '.[dev]'"]
    assert lines[-1] == ".venv/bin/python -m pytest -n auto --dist loadfile"


def test_make_dev_adds_the_web_extra_and_dist_checks_the_package(tmp_path: Path) -> None:
    assert installs(would_run("dev", tmp_path)) == ["--quiet --disable-pip-version-check -e '.[web]'"]
    dist = would_run("dist", tmp_path)
    assert ".venv/bin/python -m build --no-isolation --outdir dist ." in dist
    assert ".venv/bin/twine check --strict dist/*" in dist
