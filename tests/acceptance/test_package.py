"""The package as a user installs it: ``python -m build`` makes an sdist and a wheel from the
tracked files; each installs into a fresh venv and runs ``mscheduler`` (the console script),
``python -m mscheduler``, the demo and ``mscheduler dev`` with an app of the user's (whose
dashboard, REST API and handlers answer on 127.0.0.1), with the dashboard's files, ``py.typed``
and the pytest plugin's entry point inside.

Offline on purpose: the fresh venv gets the package with ``--no-deps`` and sees this venv's
site-packages for the dependencies (a ``.pth`` line after its own), so no registry is asked; the
test checks that ``mscheduler`` itself is imported from the fresh venv, never from the checkout.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

import httpx
import pytest

from mscheduler.domain.version import __version__
from tests.acceptance.support import REPO, environment

USER_APP = """
from mscheduler import App

app = App("mine")


@app.handler("greet")
def greet(params):
    return "hello " + params["who"]
"""
TOKEN = "package-test-token-0123456789"

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
    assert version.returncode == 0 and version.stdout.strip() == f"mscheduler {__version__}", version
    helped = _run([str(python), "-m", "mscheduler", "--help"], elsewhere)
    assert helped.returncode == 0 and "worker" in helped.stdout and "tasks" in helped.stdout, helped

    plugin = _run(
        [str(python), "-c", "from importlib.metadata import entry_points as e; print(e(group='pytest11'))"],
        elsewhere,
    )
    assert "mscheduler.testing.pytest_plugin" in plugin.stdout, plugin

    if kind == "wheel":  # the demo once is enough (it takes a few seconds)
        demo = _run([str(script), "demo"], elsewhere)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "demo OK: 53 tasks" in demo.stdout, demo.stdout[-2000:]
    _dev_serves_the_app(script, elsewhere)


def _dev_serves_the_app(script: Path, cwd: Path) -> None:
    """``mscheduler dev`` from the installed package: a user's app, its API and the dashboard."""
    (cwd / "myapp.py").write_text(USER_APP)
    env = environment()
    env.pop("PYTHONPATH", None)
    dev = subprocess.Popen(
        [str(script), "dev", "myapp:app", "--port", "0", "--token", TOKEN],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        assert dev.stdout is not None
        for line in dev.stdout:  # until the banner's last line (or the process ends)
            lines.append(line)
            if line.startswith("Ctrl+C to stop"):
                break
        found = re.search(r"REST API +(http://127\.0\.0\.1:\d+)/api/v1", "".join(lines))
        assert found, "".join(lines)
        url, auth = found.group(1), {"Authorization": f"Bearer {TOKEN}"}
        page = httpx.get(f"{url}/ui/")
        assert page.status_code == 200 and "<script" in page.text, page.text[:300]
        assert httpx.get(f"{url}/ui/js/main.js").status_code == 200
        task = {"key": "g-1", "name": "greet", "params": {"who": "package"}}
        assert httpx.post(f"{url}/api/v1/tasks", json=task, headers=auth).status_code == 201
        deadline = time.monotonic() + 30
        while (info := httpx.get(f"{url}/api/v1/tasks/g-1", headers=auth).json())["status"] != "succeeded":
            assert time.monotonic() < deadline, info
            time.sleep(0.05)
        assert info["worker_states"][0]["result"] == "hello package"
    finally:
        dev.send_signal(signal.SIGINT)
        rest, _ = dev.communicate(timeout=20)
    assert dev.returncode == 0, rest
