"""Start-up against a MongoDB server that is not there, or a malformed URI (issue 6, B2).

An unreachable server fails fast with one short line saying how to wait longer (not PyMongo's
topology dump, not 6 tries x 30 s); a malformed URI is a usage error: a clear line, exit 2, no
traceback — in ``check``, ``demo`` and ``worker`` alike. Every address is a loopback port where
nothing listens.
"""

from __future__ import annotations

import json

import pytest

from tests.acceptance.support import QUICK_RUN, command, run

APP = "tests.acceptance.worker_app"
MALFORMED = "mongodb://127.0.0.1:99999/"


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def _assert_one_clear_line(err: str, out: str) -> str:
    lines = _error_lines(err)
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: "), err
    assert "Traceback" not in out + err
    assert "Topology Description" not in err and "configured timeouts" not in err, err
    assert len(line) < 300, f"{len(line)} characters: {line}"
    return line


PORT_RANGE = "Port must be an integer between 0 and 65535"
BAD_OPTION = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=-5"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "--mongodb-uri", MALFORMED], f"invalid MongoDB URI '{MALFORMED}': {PORT_RANGE}"),
        (["demo", "--mongodb-uri", MALFORMED], f"invalid MongoDB URI '{MALFORMED}': {PORT_RANGE}"),
        # PyMongo only warns about a bad option and ignores it: the command refuses it
        (
            ["check", "--mongodb-uri", BAD_OPTION],
            f"invalid MongoDB URI '{BAD_OPTION}': serverselectiontimeoutms must be greater than 0",
        ),
    ],
    ids=["check", "demo", "bad-option"],
)
def test_a_malformed_uri_is_a_usage_error(args: list[str], message: str) -> None:
    code, out, err, seconds = run([*command(), *args])
    assert code == 2, f"exit {code}\n{out}\n{err}"
    assert message in _assert_one_clear_line(err, out)
    assert seconds < QUICK_RUN


def test_a_malformed_uri_in_the_workers_factory_is_a_usage_error() -> None:
    code, out, err, seconds = run(
        [*command(), "worker", f"{APP}:mongo_factory"], ACC_MONGODB_URI=MALFORMED, timeout=20
    )
    assert code == 2, f"exit {code}\n{out}\n{err}"
    line = _assert_one_clear_line(err, out)
    assert "calling tests.acceptance.worker_app:mongo_factory() failed: invalid MongoDB URI" in line
    assert "Port must be an integer between 0 and 65535" in line
    assert seconds < QUICK_RUN


@pytest.mark.parametrize("subcommand", ["check", "demo"])
def test_an_unreachable_server_fails_fast_in_one_line_that_says_how_to_wait_longer(
    subcommand: str, refused_port: int
) -> None:
    port = refused_port
    uri = f"mongodb://127.0.0.1:{port}/"
    code, out, err, seconds = run(
        [*command(), subcommand, "--mongodb-uri", uri, "--server-selection-timeout-ms", "300"]
    )
    assert code == 1, f"exit {code}\n{out}\n{err}"
    line = _assert_one_clear_line(err, out)
    assert f"cannot reach MongoDB at {uri}: no server answered within 300 ms" in line
    assert f"127.0.0.1:{port}" in line  # the server's own reason, e.g. connection refused
    assert "--server-selection-timeout-ms or set serverSelectionTimeoutMS in the URI" in line
    assert seconds < QUICK_RUN, f"took {seconds:.1f}s"


def test_the_default_start_up_timeout_is_short(refused_port: int) -> None:
    uri = f"mongodb://127.0.0.1:{refused_port}/"
    code, out, err, seconds = run([*command(), "check", "--mongodb-uri", uri])
    assert code == 1, err
    assert "within 2000 ms" in _assert_one_clear_line(err, out)
    assert seconds < QUICK_RUN, f"took {seconds:.1f}s"


def test_a_worker_whose_server_is_unreachable_fails_fast_instead_of_retrying_for_minutes(
    refused_port: int,
) -> None:
    # The factory's client has PyMongo's default 30 s server selection, and the driver retries a
    # transient error 5 times: about 3 minutes before this change. The worker pings first.
    port = refused_port
    code, out, err, seconds = run(
        [*command(), "worker", f"{APP}:mongo_factory", "--server-selection-timeout-ms", "400"],
        ACC_MONGODB_URI=f"mongodb://127.0.0.1:{port}/",
        timeout=40,
    )
    assert code == 1, f"exit {code}\n{out}\n{err}"
    line = _assert_one_clear_line(err, out)
    assert f"cannot reach MongoDB at 127.0.0.1:{port} (consumer acc-mongo)" in line
    assert "no server answered within 400 ms" in line
    assert "to wait longer, pass --server-selection-timeout-ms" in line
    assert seconds < QUICK_RUN, f"took {seconds:.1f}s"


def test_a_worker_start_up_failure_in_json_is_one_json_record(refused_port: int) -> None:
    code, out, err, _ = run(
        [
            *command(),
            "worker",
            f"{APP}:mongo_factory",
            "--server-selection-timeout-ms",
            "300",
            "--log-format",
            "json",
        ],
        ACC_MONGODB_URI=f"mongodb://127.0.0.1:{refused_port}/",
        timeout=40,
    )
    assert code == 1, f"exit {code}\n{out}\n{err}"
    (line,) = _error_lines(err)
    record = json.loads(line)
    assert record["level"] == "ERROR"
    assert record["exit_code"] == 1
    assert "cannot reach MongoDB" in record["message"]
