"""Run the ``mscheduler`` command in a subprocess and read its output as it comes (loopback only)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The longest a CLI run that must not wait on anything may take (it fails fast, refuses its input,
# or stops at once): far above what a loaded machine makes of a Python start and a quick command
# (a few seconds), and below what the slow path each test guards against waits for (PyMongo's
# default 30 s server selection, retries for minutes, a 60 s handler): what tells them apart is
# the order of magnitude, not the machine's speed today.
QUICK_RUN = 25.0


def command() -> list[str]:
    """The console script next to this interpreter (the venv's), else ``python -m mscheduler``."""
    script = Path(sys.executable).with_name("mscheduler")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mscheduler"]


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MSCHEDULER_TEST_MONGODB_URI", None)
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200", NO_COLOR="1", TERM="dumb")
    env.update(extra)
    return env


def run_python(code: str, timeout: float = 60) -> list[str]:
    """``python -c CODE`` from the repository (a documentation example): its printed lines, once
    it exited 0 (else the test fails with its stderr)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def printed_comments(code: str) -> list[str]:
    """What an example says it prints: the comment after each ``print(...)`` line."""
    return [c.strip() for c in re.findall(r"print\(.*\)\s+# (.*)$", code, flags=re.MULTILINE)]


def run(args: list[str], *, timeout: float = 30, **env: str) -> tuple[int, str, str, float]:
    """Run to completion; returns (exit code, stdout, stderr, seconds)."""
    started = time.monotonic()
    done = subprocess.run(
        args, cwd=REPO, env=environment(**env), capture_output=True, text=True, timeout=timeout, check=False
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


class Running:
    """A command running in the background; stdout and stderr merged, read line by line."""

    def __init__(self, args: list[str], **env: str) -> None:
        self.proc = subprocess.Popen(
            args,
            cwd=REPO,
            env=environment(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, *, count: int = 1, timeout: float = 10) -> None:
        """Until ``count`` lines match ``pattern`` (a regex); fails with the output so far."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while sum(1 for line in self.lines if regex.search(line)) < count:
            left = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(left, 0.01))
            except queue.Empty:
                line = ""
            if line is None:
                raise AssertionError(f"process ended before {count}x {pattern!r}:\n{self.output}")
            if line:
                self.lines.append(line)
            if time.monotonic() >= deadline and sum(1 for ln in self.lines if regex.search(ln)) < count:
                raise AssertionError(f"waited {timeout}s for {count}x {pattern!r}:\n{self.output}")

    def signal(self, signum: signal.Signals) -> None:
        self.proc.send_signal(signum)

    def finish(self, timeout: float = 10) -> int:
        """Wait for the exit code and the rest of the output."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s:\n{self.output}") from None
        self._reader.join(timeout=5)
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return code

    def kill(self) -> None:
        """Kill the process if it still runs (only this one, by its handle) and close the pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- in process: the CLI on a store the test set up (``cli_ops.operations_override``) ----------

URI = {"MSCHEDULER_MONGODB_URI": "mongodb://unused.invalid/"}  # never dialled with an override


def cli(*args: str) -> tuple[int, str, str]:
    """``mscheduler ARGS`` in this process: (exit code, stdout, stderr); a crash is raised."""
    from typer.testing import CliRunner

    from mscheduler.cli.main import full_app

    app = full_app()

    result = CliRunner(env={**URI, "COLUMNS": "200", "NO_COLOR": "1"}).invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr
