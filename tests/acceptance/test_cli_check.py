"""``mscheduler check`` in a subprocess: an unreachable or invalid server fails fast and clearly."""

from __future__ import annotations

from tests.acceptance.support import QUICK_RUN, command, run


def test_unreachable_server_fails_fast_with_a_clear_message() -> None:
    uri = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300"
    code, out, err, seconds = run([*command(), "check", "--mongodb-uri", uri])
    assert code == 1, f"exit {code}\n{out}\n{err}"
    assert "cannot reach MongoDB at mongodb://127.0.0.1:1/" in err, err
    assert "within 300 ms" in err, err
    assert "Traceback" not in out + err
    assert seconds < QUICK_RUN, f"took {seconds:.1f}s"


def test_timeout_option_applies_when_the_uri_has_none() -> None:
    uri = "mongodb://127.0.0.1:1/"
    code, _, err, seconds = run(
        [*command(), "check", "--mongodb-uri", uri, "--server-selection-timeout-ms", "200"]
    )
    assert code == 1, err
    assert "within 200 ms" in err, err
    assert seconds < QUICK_RUN


def test_invalid_uri_is_a_usage_error() -> None:
    code, out, err, _ = run([*command(), "check", "--mongodb-uri", "http://127.0.0.1:27017"])
    assert code == 2, f"exit {code}\n{out}\n{err}"
    assert "invalid MongoDB URI" in err, err
    assert "Traceback" not in out + err


def test_password_is_not_printed() -> None:
    uri = "mongodb://alice:s3cret@127.0.0.1:1/?serverSelectionTimeoutMS=200"
    code, out, err, _ = run([*command(), "check", "--mongodb-uri", uri])
    assert code == 1
    assert "s3cret" not in out + err
    assert "alice:***@127.0.0.1:1" in err, err
