"""The command line's surface (issue 6, B8, and B1's ``--log-format json``): ``--version``,
readable help that fits 80 columns, companion options refused, JSON log lines."""

from __future__ import annotations

import json
import signal

import pytest

import mscheduler
from tests.acceptance.support import QUICK_RUN, Running, command, run

APP = "tests.acceptance.worker_app"


def test_version() -> None:
    code, out, err, _ = run([*command(), "--version"])
    assert code == 0, err
    assert out.strip() == f"mscheduler {mscheduler.__version__}"


@pytest.mark.parametrize(
    ("subcommand", "shown"),
    [
        ([], ["--version", "demo", "worker", "check"]),
        (["demo"], ["--mongodb-uri URI", "--database NAME", "--timeout SECONDS", "--keep", "MS"]),
        (["worker"], ["MODULE:ATTR", "--grace SECONDS", "--log-level LEVEL", "--log-format", "MS"]),
        (["check"], ["--mongodb-uri URI", "--prefix PREFIX", "--server-selection-timeout-ms MS"]),
    ],
    ids=["main", "demo", "worker", "check"],
)
def test_help_fits_80_columns_and_reads_well(subcommand: list[str], shown: list[str]) -> None:
    code, out, err, _ = run([*command(), *subcommand, "--help"], COLUMNS="80")
    assert code == 0, err
    too_long = [line for line in out.splitlines() if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    cut = [line for line in out.splitlines() if line.endswith("...") and "[ARGS]" not in line]
    assert "…" not in out and not cut, out  # nothing cut short
    for text in shown:
        assert text in out, f"{text!r} not in:\n{out}"
    for unreadable in ("<str>  ", "<int range>", "<float range>", "--no-keep", "--no-strict"):
        assert unreadable not in out, f"{unreadable!r} in:\n{out}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--keep"], "--keep needs --mongodb-uri"),
        (["--database", "x"], "--database needs --mongodb-uri"),
        (["--server-selection-timeout-ms", "100"], "--server-selection-timeout-ms needs --mongodb-uri"),
        (["--keep", "--database", "x"], "--database, --keep need --mongodb-uri"),
    ],
)
def test_demo_refuses_options_that_need_a_server(args: list[str], message: str) -> None:
    code, out, err, seconds = run([*command(), "demo", *args])
    assert code == 2, f"exit {code}\n{out}\n{err}"
    assert err.strip() == f"error: {message} (the demo runs in memory without it)"
    assert "demo OK" not in out  # refused before running anything
    assert seconds < QUICK_RUN


def test_an_unknown_log_format_is_a_usage_error() -> None:
    code, _, err, _ = run([*command(), "worker", f"{APP}:factory", "--log-format", "xml"])
    assert code == 2
    assert "'xml' is not one of 'text', 'json'" in err or "xml" in err, err


def test_worker_logs_one_json_object_per_line() -> None:
    proc = Running(
        [*command(), "worker", f"{APP}:factory", "--log-format", "json", "--log-level", "DEBUG"],
        ACC_QUICK="3",
    )
    try:
        proc.wait_for(r'"message": "mscheduler worker: started 2 consumer\(s\)')
        proc.wait_for(r"^processed quick-\d on acc-worker-\d$", count=3)
        proc.signal(signal.SIGTERM)
        code = proc.finish(timeout=10)
    finally:
        proc.kill()
    assert code == 0, proc.output
    # The handlers print plain lines on stdout; everything logged is JSON, one object per line.
    records = [json.loads(line) for line in proc.lines if not line.startswith("processed ")]
    assert records, proc.output
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record), record
    started = next(r for r in records if "started 2 consumer(s)" in r["message"])
    assert started["worker_ids"] == ["acc-worker-1", "acc-worker-2"]
    assert started["logger"] == "mscheduler.cli" and started["level"] == "INFO"
    signalled = next(r for r in records if r["message"].startswith("received SIGTERM"))
    assert signalled["signal"] == "SIGTERM"
    assert any(r["message"].startswith("mscheduler worker: stopped 2 consumer(s)") for r in records)
