"""Log output for ``mscheduler worker``: plain text, or one JSON object per line.

The library only logs (``logging.getLogger("mscheduler...")``, structured fields passed with
``extra=``); configuring handlers is the application's business, or the CLI's, here.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, date, datetime, timedelta
from enum import Enum
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",  # Python 3.12+
}
# Keys the JSON line always has; a structured field with one of these names gets a prefix.
_RESERVED = ("time", "level", "logger", "message", "exc_info", "stack_info")


# Control characters a stored value may carry (C0 but tab and new line, DEL, C1) and the bidi
# controls that reorder what a terminal shows ("Trojan source").
CONTROL_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the control pictures: \x1b shows as "␛", \r as "␍"
    return "\u2421" if code == 0x7F else "\ufffd"


def plain_text(text: str) -> str:
    """``text`` safe for a terminal: every control character but tab and new line replaced by a
    visible stand-in of the same length, so an escape sequence in a task's error or key cannot
    clear the screen, move the cursor or make a link where an operator reads it."""
    return CONTROL_CHARS.sub(_picture, text)


def one_line(text: str) -> str:
    """``text`` on one line: new lines and carriage returns written as ``\\n`` and ``\\r``."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` lines with control characters made visible (``plain_text``): a worker's
    log shows handlers' errors and the API's log shows keys, which hold whatever a client put
    there. A record is one line (its message's new lines written ``\\n``), so no value can
    print a line that looks like another record; a traceback follows on lines indented by two
    spaces (never at the start of a line, where a record's time is)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.getMessage())
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        blocks = [record.exc_text] if record.exc_text else []
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        for block in blocks:
            text += "".join(f"\n  {line}" for line in block.splitlines())
        return plain_text(text)


def _jsonable(value: Any) -> Any:
    """``json.dumps`` fallback for what structured fields commonly hold."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    every structured field passed with ``extra=``, and ``exc_info`` / ``stack_info`` when present.

    A field named like one of the fixed keys is written as ``field_<name>``.
    """

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name in _STANDARD_ATTRIBUTES or name.startswith("_"):
                continue
            data[f"field_{name}" if name in _RESERVED else name] = value
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exc_info"] = record.exc_text
        if record.stack_info:
            data["stack_info"] = self.formatStack(record.stack_info)
        try:
            return json.dumps(data, default=_jsonable, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):  # NaN, a cycle, odd dict keys: those fields as repr()
            return json.dumps({k: _safe(v) for k, v in data.items()}, default=_jsonable, ensure_ascii=False)


def _safe(value: Any) -> Any:
    try:
        json.dumps(value, default=_jsonable, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)
    return value


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not the one of the time it
    was made: a process that swaps its stderr (a test runner, a daemoniser) keeps its logs."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler's own assignments: the property wins
        pass


def configure_logging(level: int, log_format: LogFormat = "text") -> None:
    """Send every record at ``level`` or above to stderr, as text or as JSON lines.

    Replaces the root logger's handlers, so calling it twice does not double the output.
    """
    handler: logging.Handler = _StderrHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
