"""The package as a user installs it: ``python -m build`` makes an sdist and a wheel from the
tracked files; each installs into a fresh venv and runs ``mscheduler`` (the console script),
``python -m mscheduler`` and the demo, with the dashboard's files and ``py.typed`` inside.

Offline on purpose: the fresh venv gets the package with ``--no-deps`` and sees this venv's
site-packages for the dependencies (a ``.pth`` line after its own), so no registry is asked; the
test checks that ``mscheduler`` itself is imported from the fresh venv, never from the checkout.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.acceptance.support import REPO, environment

pytestmark = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import build"], capture_output=True).returncode != 0,
    reason="the build package is not installed (the dev extra)",
)


def _tracked_copy(dest: Path) -> Path:
    """The tracked files (what a clone has), without caches or a local egg-info."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(
        b"\0"
    )
    for name in filter(None, files):
        source = REPO / name.decode()
        if source.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return dest


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = _tracked_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _install(artifact: Path, where: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(where)  # ensurepip: offline
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # ensurepip's setuptools (Python 3.11's) predates the PEP 639 license field: the build backend,
    # like the dependencies, comes from the test's own venv, after the fresh venv's own site-packages
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "-y", "setuptools"], check=True)
    Path(site, "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", str(artifact)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = environment()
    env.pop("PYTHONPATH", None)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_the_built_package_installs_and_runs(dist: Path, tmp_path: Path, kind: str) -> None:
    artifact = next(dist.glob("*.whl" if kind == "wheel" else "*.tar.gz"))
    python = _install(artifact, tmp_path / "venv")
    elsewhere = tmp_path / "cwd"  # not the checkout: `import mscheduler` must find the installed one
    elsewhere.mkdir()

    where = _run(
        [str(python), "-c", "import mscheduler, pathlib; print(pathlib.Path(mscheduler.__file__))"], elsewhere
    )
    assert where.returncode == 0, where.stderr
    installed = Path(where.stdout.strip()).parent
    assert str(installed).startswith(str(tmp_path / "venv")), installed
    assert (installed / "py.typed").exists()
    for name in ("index.html", "style.css", "js/main.js", "js/pages/tasks.js"):
        assert (installed / "web" / "static" / name).exists(), name

    script = tmp_path / "venv" / "bin" / "mscheduler"
    version = _run([str(script), "--version"], elsewhere)
    assert version.returncode == 0 and version.stdout.strip() == "mscheduler 0.1.0", version
    helped = _run([str(python), "-m", "mscheduler", "--help"], elsewhere)
    assert helped.returncode == 0 and "worker" in helped.stdout and "tasks" in helped.stdout, helped

    if kind == "wheel":  # the demo once is enough (it takes a few seconds)
        demo = _run([str(script), "demo"], elsewhere)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "demo OK: 53 tasks" in demo.stdout, demo.stdout[-2000:]
