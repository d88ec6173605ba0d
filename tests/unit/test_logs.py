"""``mscheduler worker --log-format json``: one JSON object per record, with every structured field."""

from __future__ import annotations

import io
import json
import logging
import math
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mscheduler.domain.model import TaskStatus
from mscheduler.observability.logs import JsonFormatter, configure_logging


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("mscheduler.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_is_one_json_line_with_the_fixed_keys(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.info("claimed %s", "invoice-42")
    (line,) = _lines(stream)
    assert line["message"] == "claimed invoice-42"
    assert line["level"] == "INFO"
    assert line["logger"] == "mscheduler.test_logs"
    when = datetime.fromisoformat(line["time"])
    assert when.utcoffset() == timedelta(0)
    assert abs((datetime.now(UTC) - when).total_seconds()) < 60
    # nothing of the LogRecord's own bookkeeping leaks in
    assert set(line) == {"time", "level", "logger", "message"}


def test_every_structured_field_is_included(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    at = datetime(2030, 1, 1, tzinfo=UTC)
    logger.warning(
        "attempt failed",
        extra={
            "key": "invoice-42",
            "attempt_no": 3,
            "worker_id": "w1",
            "error_type": "RuntimeError",
            "retry_at": at,
            "delay": timedelta(milliseconds=1500),
            "status": TaskStatus.FAILED,
            "ids": ("a", "b"),
            "nested": {"x": [1, None]},
        },
    )
    (line,) = _lines(stream)
    assert line["key"] == "invoice-42"
    assert line["attempt_no"] == 3
    assert line["worker_id"] == "w1"
    assert line["error_type"] == "RuntimeError"
    assert line["retry_at"] == "2030-01-01T00:00:00+00:00"
    assert line["delay"] == 1.5
    assert line["status"] == "failed"
    assert line["ids"] == ["a", "b"]
    assert line["nested"] == {"x": [1, None]}


def test_a_field_named_like_a_fixed_key_does_not_replace_it(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    logger.info("hello", extra={"level": "custom", "time": 5, "logger": "x"})
    (line,) = _lines(stream)
    assert (line["level"], line["logger"]) == ("INFO", "mscheduler.test_logs")
    assert (line["field_level"], line["field_time"], line["field_logger"]) == ("custom", 5, "x")


def test_tracebacks_and_odd_values_stay_on_one_valid_line(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("handler raised", extra={"score": math.nan, "obj": object(), "err": KeyError("k")})
    text = stream.getvalue()
    assert text.count("\n") == 1
    (line,) = _lines(stream)
    assert line["level"] == "ERROR"
    assert "Traceback" in line["exc_info"] and "ValueError: boom" in line["exc_info"]
    assert line["score"] == "nan"  # NaN is not JSON: written as its repr
    assert line["obj"].startswith("<object object at")
    assert line["err"] == "KeyError: 'k'"


def test_configure_logging_replaces_handlers_instead_of_adding(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers, root.level
    root.handlers = []  # force=True closes the handlers it replaces: keep pytest's out of reach
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        configure_logging(logging.INFO, "json")
        configure_logging(logging.INFO, "json")
        logging.getLogger("mscheduler.consumer").info("started", extra={"worker_id": "w1"})
        logging.getLogger("mscheduler.consumer").debug("not shown")
        configure_logging(logging.WARNING, "text")
        logging.getLogger("mscheduler.consumer").warning("as text")
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert json.loads(lines[0])["worker_id"] == "w1"
    assert lines[1].endswith("WARNING mscheduler.consumer: as text")


def test_records_go_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that swaps ``sys.stderr`` after setting logging up (a test runner, a daemoniser)
    gets its later records on the new stream, not on the one of set-up time (maybe closed)."""
    # force=True closes the handlers it replaces: keep pytest's out of reach (restored after)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging(logging.INFO, "text")
    monkeypatch.setattr(sys, "stderr", second)
    first.close()
    logging.getLogger("mscheduler.test").info("after the swap")
    assert second.getvalue().splitlines() == [second.getvalue().strip()]  # one record, no error
    assert second.getvalue().rstrip().endswith("INFO mscheduler.test: after the swap")


def test_a_text_record_is_one_line_whatever_its_values_hold() -> None:
    from mscheduler.observability.logs import TextFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("mscheduler.test_text_logs")
    logger.addHandler(handler)
    logger.propagate = False
    forged = "k\n2030-01-01 00:00:00,000 INFO mscheduler.web: all good\r\x1b[2J"
    try:
        logger.warning("task %s failed", forged)
        try:
            raise RuntimeError(f"bad key {forged}")
        except RuntimeError:
            logger.exception("while sending %s", forged)
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    records = [line for line in lines if not line.startswith("  ")]
    assert len(records) == 2  # each record one line; nothing looks like a third record
    assert records[0].endswith("task k\\n2030-01-01 00:00:00,000 INFO mscheduler.web: all good\\r␛[2J failed")
    assert all(line.startswith("  ") for line in lines[2:])
    assert any(line.startswith("  RuntimeError: bad key") for line in lines)
