"""What a server writes to its oplog for an update: the size of the delta between a document before
and after (``$v: 2`` update entries), estimated the way the server computes it.

Reference: ``src/mongo/db/update/document_diff_calculator.cpp`` (MongoDB 5.0+). An update's oplog
entry holds a diff of the document: for each field of the post-image, nothing when it is unchanged,
an insert (``i``) when new, an update (``u``) with the new value, a sub-diff (``s<field>``) when an
object (or an array) changed inside; a delete (``d``) for each field gone. Arrays are diffed
position by position (``u<index>`` per changed position, ``l`` for a shorter length), so removing
an element shifts every later one into the diff. When the diff is not smaller than the
post-image the server logs the whole document (a replacement) instead: that is what the size
here falls back to as well.

mongomock writes no oplog; this is computed from the documents it holds before and after a write
(what the server would have computed from the same two documents). BSON sizes are exact; the
diff's layout is a faithful approximation (the server may also replace a sub-object by value when
its sub-diff is larger, which only lowers the figure)."""

from __future__ import annotations

from typing import Any

import bson


def bson_size(doc: dict[str, Any]) -> int:
    return len(bson.encode(doc))


def _value_size(value: Any) -> int:
    """The BSON size of a value as an element (type byte and an empty name left out)."""
    return bson_size({"": value}) - 5 - 2


def _array_diff(before: list[Any], after: list[Any]) -> dict[str, Any]:
    diff: dict[str, Any] = {"a": True}
    if len(after) < len(before):
        diff["l"] = len(after)
    for i, value in enumerate(after):
        if i < len(before) and before[i] == value:
            continue
        if i < len(before) and isinstance(before[i], dict) and isinstance(value, dict):
            diff[f"s{i}"] = _object_diff(before[i], value)
        else:
            diff[f"u{i}"] = value
    return diff


def _object_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    deleted = {k: False for k in before if k not in after}
    updated: dict[str, Any] = {}
    inserted: dict[str, Any] = {}
    subs: dict[str, Any] = {}
    for key, value in after.items():
        if key not in before:
            inserted[key] = value
        elif before[key] == value and type(before[key]) is type(value):
            continue
        elif isinstance(before[key], dict) and isinstance(value, dict):
            subs[f"s{key}"] = _object_diff(before[key], value)
        elif isinstance(before[key], list) and isinstance(value, list):
            subs[f"s{key}"] = _array_diff(before[key], value)
        else:
            updated[key] = value
    diff: dict[str, Any] = {}
    if deleted:
        diff["d"] = deleted
    if updated:
        diff["u"] = updated
    if inserted:
        diff["i"] = inserted
    diff.update(subs)
    return diff


def oplog_bytes(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, str]:
    """The BSON bytes of the oplog entry's ``o`` for an update from ``before`` to ``after``, and
    its kind: ``"delta"`` or ``"replacement"`` (the diff was not smaller than the document)."""
    delta = {"$v": 2, "diff": _object_diff(before, after)}
    size, whole = bson_size(delta), bson_size(after)
    return (size, "delta") if size < whole else (whole, "replacement")
