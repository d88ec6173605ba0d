"""Uniqueness by params: the canonical hash of a task's name and params.

``Task(..., unique_by="params")`` stores ``params_hash(name, params)`` with the task; while the
task is pending or running, no other task with the same hash is created (a unique partial index
in MongoDB, a dict of live hashes in the memory driver).

The hash is SHA-256 of a canonical JSON text of ``[name, params]``: object keys sorted (so the
order in which a dict was built does not matter), no whitespace, strings as UTF-8, datetimes as
tagged ISO strings (millisecond precision, as stored). Values keep their JSON type: ``1`` and
``1.0`` are different params, as are ``[1, 2]`` and ``[2, 1]``; ``True`` is not ``1``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from mscheduler.domain.model import check_params

HASH_PREFIX = "sha256:"


def _canonical(value: Any) -> Any:
    """``value`` with every datetime replaced by a tagged string (JSON has no dates); a dict key
    cannot collide with the tag because stored keys never start with ``$``."""
    if isinstance(value, datetime):
        return {"$date": value.isoformat(timespec="milliseconds")}
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def params_hash(name: str, params: Any) -> str:
    """``"sha256:<hex>"`` of the task name and its params, the same whatever the key order of
    the dicts in ``params``. ``params`` are checked as ``Task`` checks them (``ValueError``)."""
    text = json.dumps(
        [name, _canonical(check_params(params))],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return HASH_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()
