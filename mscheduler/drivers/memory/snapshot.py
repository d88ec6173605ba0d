"""A ``MemoryDriver``'s store in a file and back (``mscheduler dev --data FILE``).

``dump`` copies the tasks, plans, flow limits and the event log at one instant (no operation
awaits inside, so the copy is consistent, as every memory operation is atomic on the loop);
``restore`` puts them into an empty driver and rebuilds its indexes; ``save`` / ``load`` write
and read MongoDB extended JSON (times stay times), written to a temporary file and renamed over
the old one, so a crash while saving leaves the previous snapshot whole. Registered workers are
not kept: the consumers that start with the store register again.

A snapshot is read as untrusted input: every value must be one the store writes (strings,
numbers, booleans, None, aware times, lists, and mappings whose keys do not start with ``$``:
no ``$code``, ``$regex`` or other BSON extras), nested at most ``MAX_DEPTH`` levels, and every
key, name and id must pass the rules a send or an operator's call would; anything else refuses
the whole file (``InvalidInput``, one line) and leaves the driver unused.

What a snapshot cannot keep is everything after it: changes since the last save are lost in a
crash, and attempts running at that instant come back ``running`` with the lease they had then,
so they run out and are retried like a crashed worker's (counted against the retry budget).
"""

from __future__ import annotations

import copy
import math
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bson import json_util

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import validate_key, validate_name
from mscheduler.domain.plans import validate_plan_id

if TYPE_CHECKING:
    from mscheduler.drivers.memory.driver import MemoryDriver

FORMAT = "mscheduler-memory-snapshot"
VERSION = 1
MAX_DEPTH = 64  # a task's params and results (32 levels) inside its document, with room to spare
CANONICAL_JSON = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL, tz_aware=True)


def dump(driver: MemoryDriver, now: datetime) -> dict[str, Any]:
    """The store as plain data (copies: the driver may change on)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "written": now,
        "tasks": [copy.deepcopy(doc) for doc in driver._tasks.values()],
        "plans": [copy.deepcopy(doc) for doc in driver._plans.values()],
        "limits": [copy.deepcopy(doc) for doc in driver._limits.values()],
        "events": list(driver.stored_events()),
    }


def restore(driver: MemoryDriver, data: dict[str, Any]) -> None:
    """Put a ``dump`` into an empty driver and rebuild every index (claim heaps, listings,
    unique hashes, plan due times, limit names)."""
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise InvalidInput(f"not a {FORMAT} of version {VERSION}")
    if driver._tasks or driver._plans or driver._limits or driver._events:
        raise InvalidInput("a snapshot is restored into an empty store only")
    check_documents(data)
    for doc in data["tasks"]:
        key = doc["key"]
        driver._tasks[key] = doc
        driver._list_new(doc)
        if doc.get("children") is not None:
            driver._parents.add(key)
        finish = doc["state"].get("finish_time")
        driver._write(doc, doc["state"]["update_time"])  # re-derives, re-indexes, keeps the times
        if finish is not None:  # unchanged by the write: listed here
            driver._relist(doc, None)
    for doc in data["plans"]:
        driver._plans[doc["plan_id"]] = doc
        driver._index_plan(doc)
    for doc in data["limits"]:
        driver._limits[doc["_id"]] = doc
        for name in doc.get("names", []):
            driver._limit_of_name[name] = doc["_id"]
    driver.restore_events(data["events"])


def check_documents(data: dict[str, Any]) -> None:
    """Every document of a snapshot holds only what the store writes (see the module), and its
    identifiers pass their rules: ``InvalidInput`` naming the first that does not."""
    for part in ("tasks", "plans", "limits", "events"):
        if not isinstance(data.get(part), list):
            raise InvalidInput(f"not a whole snapshot ({part}: a list of documents)")
        for n, doc in enumerate(data[part]):
            where = f"{part}[{n}]"
            if not isinstance(doc, dict):
                raise InvalidInput(f"{where}: a document")
            check_value(doc, where)
            try:
                _check_ids(part, doc)
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidInput(f"{where}: {exc}") from None


def _check_ids(part: str, doc: dict[str, Any]) -> None:
    if part in ("tasks", "events"):
        validate_key(doc["key"])
        validate_name(doc["name"])
    elif part == "plans":
        validate_plan_id(doc["plan_id"])
        validate_name(doc["task"]["name"])
    else:
        validate_name(doc["_id"])
        for name in doc.get("names", []):
            validate_name(name)


def check_value(value: Any, where: str, depth: int = 0) -> None:
    """``value`` is one the store writes, nested at most ``MAX_DEPTH`` levels (``InvalidInput``)."""
    if depth > MAX_DEPTH:
        raise InvalidInput(f"{where}: nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if value is None or kind is bool or kind is str:  # exactly: bson's Code is a str
        return
    if isinstance(value, int) and kind is not bool:
        if not -(2**63) <= value < 2**63:
            raise InvalidInput(f"{where}: an integer beyond 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"{where}: NaN or infinity")
    elif isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidInput(f"{where}: a time without its offset")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or key.startswith("$") or "\x00" in key:
                raise InvalidInput(f"{where}: a field name the store never writes")
            check_value(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_value(item, f"{where}[{i}]", depth + 1)
    else:
        raise InvalidInput(f"{where}: a {type(value).__name__}, which the store never writes")


def save(driver: MemoryDriver, path: Path, now: datetime) -> int:
    """Write the store to ``path`` (atomically: a temporary file renamed over it); its size."""
    text = json_util.dumps(dump(driver, now), json_options=CANONICAL_JSON)
    return write_text(path, text)


def write_text(path: Path, text: str) -> int:
    """``text`` into ``path`` through a temporary file in the same directory, then a rename."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return len(text)


def load(driver: MemoryDriver, path: Path) -> int:
    """Restore the store saved at ``path`` into ``driver``; the number of tasks. ``InvalidInput``
    for a file that is not a snapshot (the driver is then not to be used: start afresh)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = json_util.loads(text, json_options=CANONICAL_JSON)
    except OSError as exc:
        raise InvalidInput(f"cannot read the snapshot {str(path)!r}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise InvalidInput(f"{str(path)!r} is not a snapshot (not JSON: {exc})") from exc
    except RecursionError:
        raise InvalidInput(f"{str(path)!r} is not a snapshot (nested too deeply)") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{str(path)!r} is not a snapshot")
    try:
        restore(driver, data)
    except InvalidInput as exc:
        raise InvalidInput(f"{str(path)!r}: {exc}") from exc
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise InvalidInput(f"{str(path)!r} is not a whole snapshot ({type(exc).__name__}: {exc})") from exc
    return len(data["tasks"])
