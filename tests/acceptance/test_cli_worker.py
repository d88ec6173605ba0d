"""``mscheduler worker MODULE:ATTR`` in a subprocess: runs, stops on signals, rejects bad targets."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from tests.acceptance.support import QUICK_RUN, Running, command, run

APP = "tests.acceptance.worker_app"


def test_worker_processes_tasks_and_stops_gracefully_on_sigterm() -> None:
    proc = Running([*command(), "worker", f"{APP}:factory"], ACC_QUICK="5", ACC_SLOW_SECONDS="1.0")
    try:
        proc.wait_for(r"started 2 consumer\(s\) \[acc-worker-1, acc-worker-2\]")
        proc.wait_for(r"^processed quick-\d on acc-worker-\d$", count=5)
        proc.wait_for(r"^slow started slow-0")
        proc.signal(signal.SIGTERM)
        code = proc.finish(timeout=10)
    finally:
        proc.kill()
    out = proc.output
    assert code == 0, out
    assert "received SIGTERM: stopping gracefully" in out
    # Graceful: the running handler was allowed to finish, not cancelled.
    assert "slow finished slow-0" in out
    assert "slow cancelled" not in out
    assert out.index("received SIGTERM") < out.index("slow finished slow-0")
    assert "stopped 2 consumer(s)" in out
    assert len({line for line in proc.lines if line.startswith("processed quick-")}) == 5


def test_second_signal_stops_at_once() -> None:
    proc = Running([sys.executable, "-m", "mscheduler", "worker", f"{APP}:factory"], ACC_SLOW_SECONDS="60")
    try:
        proc.wait_for(r"^slow started slow-0")
        proc.signal(signal.SIGINT)
        proc.wait_for(r"received SIGINT: stopping gracefully")
        time.sleep(0.3)
        assert proc.proc.poll() is None, "a graceful stop must wait for the 60 s handler"
        started = time.monotonic()
        proc.signal(signal.SIGINT)
        code = proc.finish(timeout=2 * QUICK_RUN)
        stopped_in = time.monotonic() - started
    finally:
        proc.kill()
    out = proc.output
    assert code == 0, out
    assert "received SIGINT again: stopping now" in out
    assert "slow cancelled slow-0" in out
    assert "slow finished" not in out
    assert stopped_in < QUICK_RUN, f"took {stopped_in:.1f}s to stop after the second signal"


def test_grace_option_bounds_the_graceful_stop() -> None:
    proc = Running([*command(), "worker", f"{APP}:factory", "--grace", "0.5"], ACC_SLOW_SECONDS="60")
    try:
        proc.wait_for(r"^slow started slow-0")
        started = time.monotonic()
        proc.signal(signal.SIGTERM)
        code = proc.finish(timeout=2 * QUICK_RUN)
        stopped_in = time.monotonic() - started
    finally:
        proc.kill()
    assert code == 0, proc.output
    assert "slow cancelled slow-0" in proc.output
    assert 0.4 < stopped_in < QUICK_RUN, stopped_in


def test_sync_factory_returning_one_consumer() -> None:
    proc = Running([*command(), "worker", f"{APP}:sync_factory"])
    try:
        proc.wait_for(r"started 1 consumer\(s\) \[acc-sync\]")
        proc.signal(signal.SIGTERM)
        code = proc.finish(timeout=10)
    finally:
        proc.kill()
    assert code == 0, proc.output


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon_here", "expected MODULE:ATTR"),
        (f"{APP}:", "expected MODULE:ATTR"),
        ("tests.acceptance.no_such_module:factory", "cannot import module 'tests.acceptance.no_such_module'"),
        (f"{APP}:missing", f"'{APP}' has no attribute 'missing'"),
        (
            f"{APP}:not_a_consumer",
            f"{APP}:not_a_consumer is of type int; expected an mscheduler.App, a Consumer, a list of",
        ),
        (f"{APP}:factory_with_argument", "must take no arguments"),
        (f"{APP}:broken_factory", "the factory could not connect to its database"),
    ],
)
def test_bad_target_gives_a_clear_error(target: str, message: str) -> None:
    code, out, err, seconds = run([*command(), "worker", target], timeout=20)
    assert code != 0, out + err
    assert message in err, err
    assert err.lstrip().startswith("error:"), err
    if "broken_factory" not in target:
        assert "Traceback" not in out + err  # a plain message, not a crash
    assert seconds < QUICK_RUN
