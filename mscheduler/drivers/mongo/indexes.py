"""Index building and checking for every collection of the Mongo driver.

An index is an ``(keys, options)`` pair with a name (the collections' modules list theirs).
``ensure_indexes`` makes a collection's indexes match the list: it creates what is missing and
rebuilds an index whose spec changed (a worker retention's TTL, say). ``index_problems`` says,
without changing anything, what a collection lacks (a consumer checks at start; ``mscheduler setup`` builds).

Why rebuild: ``createIndexes`` refuses an index whose name exists with other keys
(IndexKeySpecsConflict, 86) or whose name or keys exist with other options (IndexOptionsConflict,
85): ``setup()`` would otherwise stop there, before the later indexes exist. The index being rebuilt is
missing for the time of the build: the query it serves reads more meanwhile (its hint fails until
the index exists again), so upgrade at a quiet time or let ``mscheduler setup`` do it first.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

from pymongo.errors import OperationFailure

log = logging.getLogger("mscheduler.mongo")

IndexDef = tuple[Any, dict[str, Any]]  # (keys, options with "name")

# createIndexes refusals that mean "an index of that name, or on those keys, exists with another
# spec": IndexOptionsConflict, IndexKeySpecsConflict
SPEC_CONFLICT_CODES = frozenset({85, 86})
INDEX_NOT_FOUND = 27  # dropIndexes of a name that is not there (another node dropped it first)
# options that make an index what it is (others, such as "background", change nothing)
_COMPARED_OPTIONS = ("unique", "partialFilterExpression", "sparse", "expireAfterSeconds")


def key_list(keys: Any) -> list[tuple[str, Any]]:
    """An index's keys as ``[(field, direction), ...]`` in order (a string is one ascending key)."""
    if isinstance(keys, str):
        return [(keys, 1)]
    if isinstance(keys, dict):
        return list(keys.items())
    return [(str(k), v) for k, v in keys]


def _same_keys(a: Any, b: Any) -> bool:
    return [(k, float(v) if isinstance(v, int | float) else v) for k, v in key_list(a)] == [
        (k, float(v) if isinstance(v, int | float) else v) for k, v in key_list(b)
    ]


def differs(index: IndexDef, info: dict[str, Any]) -> list[str]:
    """How an existing index (``list_indexes`` entry) differs from the wanted one (empty: same)."""
    keys, options = index
    found = []
    if not _same_keys(keys, info.get("key", {})):
        found.append("keys")
    for option in _COMPARED_OPTIONS:
        if option == "expireAfterSeconds":
            continue  # a changed TTL period is changed in place (collMod), not rebuilt
        if bool(options.get(option)) != bool(info.get(option)) or (
            option == "partialFilterExpression" and options.get(option) != _plain(info.get(option))
        ):
            found.append(option)
    return found


def _plain(value: Any) -> Any:
    """A BSON document read back (SON, nested) as plain dicts, for comparison."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


async def existing_indexes(collection: Any) -> dict[str, dict[str, Any]]:
    cursor = collection.list_indexes()
    if inspect.isawaitable(cursor):
        cursor = await cursor
    return {ix["name"]: dict(ix) async for ix in cursor}


async def _drop(collection: Any, name: str) -> None:
    try:
        await collection.drop_index(name)
    except OperationFailure as exc:
        if exc.code != INDEX_NOT_FOUND:
            raise


async def ensure_indexes(collection: Any, indexes: Sequence[IndexDef]) -> list[str]:
    """Create ``indexes`` on ``collection`` (idempotent); rebuild one whose spec changed (85 / 86:
    the conflicting index, under that name or on those keys with another name, is dropped
    first). Returns the names rebuilt."""
    ours = {options["name"] for _, options in indexes}
    changed: list[str] = []
    for keys, options in indexes:
        try:
            await collection.create_index(keys, **options)
            continue
        except OperationFailure as exc:
            if exc.code not in SPEC_CONFLICT_CODES:
                raise
        existing = await existing_indexes(collection)
        conflicting = [
            name
            for name, info in existing.items()
            if name == options["name"]
            or (name not in ours and name != "_id_" and _same_keys(keys, info["key"]))
        ]
        for name in conflicting:
            log.warning(
                "index %r of %s: its spec changed since the build that made it; rebuilding it",
                name,
                collection.name,
            )
            await _drop(collection, name)
        await collection.create_index(keys, **options)
        changed.append(options["name"])
    return changed


async def index_problems(collection: Any, indexes: Sequence[IndexDef]) -> list[str]:
    """What ``collection`` lacks of ``indexes``: ``"<name> (missing)"`` or ``"<name> (keys
    differ)"``; empty when every index is there as specified."""
    existing = await existing_indexes(collection)
    problems = []
    for index in indexes:
        name = index[1]["name"]
        info = existing.get(name)
        if info is None:
            problems.append(f"{name} (missing)")
        elif found := differs(index, info):
            problems.append(f"{name} ({', '.join(found)} differ)")
    return problems
