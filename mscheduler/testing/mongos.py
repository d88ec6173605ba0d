"""A stand-in for mongos: the patched mongomock (``mscheduler.testing.mongomock``) behind a router
that keeps MongoDB's documented rules for sharded collections, answering as the server does (its
error text and code). A test runs ``MongoDriver`` on it as on a sharded cluster: ``setup()``, then
``shard()``, which sends the stand-in the same admin commands as a real mongos
(``shardCollection``, ``split``, ``listShards``, ``addShardToZone``, ``updateZoneKeyRange``), from
which it learns the shard key and where each chunk lives. Nothing is really split: one in-memory
collection holds every document, and each write is checked as a mongos would route it.

The rules, for a sharded collection (shard key ``{part: 1, _id: 1}`` for mscheduler's tasks):

* an upsert (``update``, ``findAndModify``) names the full shard key by equality, else 61
  ("Failed to target upsert by query :: could not extract exact shard key");
* a single-document ``update`` has an equality on ``_id`` or targets one shard, else 72;
* a ``findAndModify`` targets one shard, else 61 ("Query for sharded findAndModify must contain
  the shard key");
* a single-document ``delete`` has an equality on ``_id`` or targets one shard, else 61;
* an update that changes a shard-key value (or sets a missing one) names the full shard key by
  equality (31025) and changes one document (72, "Multi-update operations are not allowed when
  updating the shard key field."); ``_id`` never changes (66, mongomock's own);
* a shard-key value is not an array (61); a unique index is prefixed by the shard key (67, and
  ``shardCollection`` refuses a collection that has another: 72);
* a ``hint`` names an index (2: every collection of the patched mongomock).

"Targets one shard": the filter's conditions on the shard key's first field (an equality, an
``$in``, within ``$and``) reach chunks of one shard. With ``prefix_targeting=False`` the stand-in
is an older server (5.0 / 6.0 / 7.0 patch releases before mid-2023): a ``findAndModify`` and a
single-document ``update`` / ``delete`` need the full shard key (or, for the latter two, ``_id``)
by equality, whatever the chunks.

And one rule of mscheduler's own store, which no mongos can know: in a store whose layout
(``<prefix>mscheduler_meta``) records P partitions, a task document's ``part`` is its key's
partition (``part_of(_id, P)``); a document placed elsewhere is refused (``MisplacedTask``).

Chunks without a zone are spread over the shards round-robin (as a balancer would); a zone's
chunks live on its first shard.
"""

from __future__ import annotations

import contextvars
import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mongomock.collection
import mongomock.helpers
from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo.errors import OperationFailure, WriteError

from mscheduler.domain.partitions import part_of
from mscheduler.drivers.mongo.common import META, TASKS
from mscheduler.testing import mongomock_patches

ILLEGAL_OPERATION = 20
SHARD_KEY_NOT_FOUND = 61
SHARD_NOT_FOUND = 70
INVALID_OPTIONS = 72
CANNOT_CREATE_INDEX = 67
ALREADY_INITIALIZED = 23
UNAUTHORIZED = 13
SHARD_KEY_UPDATE = 31025

FIND_AND_MODIFY_NEEDS_KEY = "Query for sharded findAndModify must contain the shard key"
UPSERT_NEEDS_KEY = "Failed to target upsert by query :: could not extract exact shard key"
MULTI_CHANGES_KEY = "Multi-update operations are not allowed when updating the shard key field."
CHANGE_NEEDS_KEY = "Shard key update is not allowed without specifying the full shard key in the query"

# mongomock's, hooked below (typed as Any: mongomock's hints are partial)
helpers: Any = mongomock.helpers
Collection: Any = mongomock.collection.Collection


class MisplacedTask(WriteError):
    """A task document whose ``part`` is not its key's partition (mscheduler's placement rule)."""


@dataclass
class ShardedCollection:
    """What a mongos knows of one sharded collection: its shard key, its chunk boundaries (on the
    key's first field) and its zones."""

    namespace: str
    key: list[tuple[str, Any]]
    shards: list[str]
    boundaries: list[Any] = field(default_factory=list)  # sorted values of the first field
    zones: list[tuple[Any, Any, str]] = field(default_factory=list)  # [low, high) -> zone

    @property
    def fields(self) -> list[str]:
        return [name for name, _ in self.key]

    def pattern(self) -> str:
        return "{ " + ", ".join(f"{name}: {direction}" for name, direction in self.key) + " }"

    def shard_of(self, value: Any, zone_shards: Mapping[str, list[str]]) -> str:
        """The shard holding the chunk of a first-field ``value``."""
        for low, high, zone in self.zones:
            if _before(low, value) and _before(value, high, strict=True) and zone_shards.get(zone):
                return zone_shards[zone][0]
        chunk = sum(1 for b in self.boundaries if not _before(value, b, strict=True))
        return self.shards[chunk % len(self.shards)]


def _rank(value: Any) -> tuple[int, Any]:
    if isinstance(value, MinKey):
        return (0, 0)
    if isinstance(value, MaxKey):
        return (2, 0)
    return (1, value)


def _before(a: Any, b: Any, *, strict: bool = False) -> bool:
    """``a <= b`` (``a < b`` if strict), MinKey and MaxKey at the ends."""
    return _rank(a) < _rank(b) if strict else _rank(a) <= _rank(b)


@dataclass
class Cluster:
    """The sharded cluster behind one stand-in client: its shards, zones and sharded collections."""

    shards: list[str]
    prefix_targeting: bool = True
    zone_shards: dict[str, list[str]] = field(default_factory=dict)
    collections: dict[str, ShardedCollection] = field(default_factory=dict)


def mongos_database(name: str = "mscheduler_test", *, shards: int = 2, prefix_targeting: bool = True) -> Any:
    """A fresh in-memory async database behind a stand-in mongos of ``shards`` shards (see the
    module doc). Shard a collection as on a cluster: ``MongoDriver(db, partitions=P,
    sharded=True)``, ``await driver.setup()``, ``await driver.shard()``."""
    from mongomock_motor import AsyncMongoMockClient

    if shards < 1:
        raise ValueError("shards: at least one")
    mongomock_patches.apply()
    apply()
    client: Any = AsyncMongoMockClient()
    client._store.mongos = Cluster([f"shard-{i}" for i in range(shards)], prefix_targeting)
    return client[name]


# -- reading filters ---------------------------------------------------------------------------------

_NO_VALUE = object()


def _clauses(filter_: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The top-level conditions of a filter, those inside ``$and`` included."""
    for key, value in filter_.items():
        if key == "$and" and isinstance(value, list):
            for clause in value:
                if isinstance(clause, Mapping):
                    yield from _clauses(clause)
        elif not key.startswith("$"):
            yield key, value


def _equality(condition: Any) -> Any:
    """The value a condition says its field equals, or ``_NO_VALUE``."""
    if isinstance(condition, Mapping):
        operators = [k for k in condition if k.startswith("$")]
        if not operators:
            return condition  # an embedded document, compared whole
        if operators == ["$eq"] and len(condition) == 1:
            return condition["$eq"]
        return _NO_VALUE
    if isinstance(condition, (list, helpers.RE_TYPE)):
        return _NO_VALUE
    return condition


def equality_on(filter_: Mapping[str, Any], name: str) -> Any:
    """The value ``filter_`` fixes ``name`` to by equality, or ``_NO_VALUE``."""
    for key, condition in _clauses(filter_):
        if key == name:
            value = _equality(condition)
            if value is not _NO_VALUE:
                return value
    return _NO_VALUE


def values_of(filter_: Mapping[str, Any], name: str) -> list[Any] | None:
    """The values ``name`` may take under ``filter_`` (equalities and ``$in``, intersected over
    the clauses), or None when the filter does not bound it to a list."""
    found: list[Any] | None = None
    for key, condition in _clauses(filter_):
        if key != name:
            continue
        value = _equality(condition)
        if value is not _NO_VALUE:
            values = [value]
        elif isinstance(condition, Mapping) and list(condition) == ["$in"]:
            values = list(condition["$in"])
        else:
            continue
        found = values if found is None else [v for v in found if v in values]
    return found


# -- the rules -----------------------------------------------------------------------------------


def _sharding(collection: Any) -> tuple[Cluster, ShardedCollection] | None:
    cluster = getattr(collection.database.client._store, "mongos", None)
    if cluster is None:
        return None
    sharded = cluster.collections.get(collection.full_name)
    if sharded is None:
        return None
    if not collection._store.is_created:  # dropped since it was sharded
        del cluster.collections[collection.full_name]
        return None
    return cluster, sharded


def _shards_reached(cluster: Cluster, sharded: ShardedCollection, filter_: Mapping[str, Any]) -> set[str]:
    values = values_of(filter_, sharded.fields[0])
    if values is None:
        return {s for s in cluster.shards if s in _holding(cluster, sharded)}
    return {sharded.shard_of(v, cluster.zone_shards) for v in values}


def _holding(cluster: Cluster, sharded: ShardedCollection) -> set[str]:
    """The shards holding a chunk of the collection."""
    edges = [MinKey(), *sharded.boundaries]
    held = {sharded.shard_of(edge, cluster.zone_shards) for edge in edges}
    for low, _, _ in sharded.zones:
        held.add(sharded.shard_of(low, cluster.zone_shards))
    return held


def _full_key(sharded: ShardedCollection, filter_: Mapping[str, Any]) -> bool:
    return all(equality_on(filter_, name) is not _NO_VALUE for name in sharded.fields)


def _exact_id(filter_: Mapping[str, Any]) -> bool:
    return equality_on(filter_, "_id") is not _NO_VALUE


def _one_shard(cluster: Cluster, sharded: ShardedCollection, filter_: Mapping[str, Any]) -> bool:
    if not cluster.prefix_targeting:
        return _full_key(sharded, filter_)
    return len(_shards_reached(cluster, sharded, filter_)) == 1


def check_update(
    cluster: Cluster,
    sharded: ShardedCollection,
    spec: Mapping[str, Any],
    document: Any,
    *,
    upsert: bool,
    multi: bool,
) -> None:
    """Whether a mongos would route an update (``upsert``, ``multi``) of ``spec`` at all."""
    if upsert:
        if not _full_key(sharded, spec):
            raise WriteError(UPSERT_NEEDS_KEY, code=SHARD_KEY_NOT_FOUND)
        return
    if multi or _exact_id(spec) or _one_shard(cluster, sharded, spec):
        return
    replacement = isinstance(document, Mapping) and not any(k.startswith("$") for k in document)
    if replacement and _full_key(sharded, document):
        return  # a replacement is routed by the shard key it holds
    request = f"Update request: {{ q: {dict(spec)}, multi: false }}, shard key pattern: {sharded.pattern()}"
    if not cluster.prefix_targeting:
        raise WriteError(
            "A single update on a sharded collection must contain an exact match on _id (and have the "
            "collection default collation) or contain the shard key (and have the simple collation). "
            + request,
            code=SHARD_KEY_NOT_FOUND,
        )
    reached = len(_shards_reached(cluster, sharded, spec))
    raise WriteError(
        "A {multi:false} update on a sharded collection must contain an exact match on _id (and have "
        "the collection default collation) or target a single shard (and have the simple collation), "
        f"but this update targeted {reached} shards. " + request,
        code=INVALID_OPTIONS,
    )


def check_delete(
    cluster: Cluster, sharded: ShardedCollection, filter_: Mapping[str, Any], *, multi: bool
) -> None:
    if multi or _exact_id(filter_) or _one_shard(cluster, sharded, filter_):
        return
    raise WriteError(
        "A single delete on a sharded collection must contain an exact match on _id (and have the "
        "collection default collation) or contain the shard key (and have the simple collation). "
        f"Delete request: {{ q: {dict(filter_)}, limit: 1 }}, shard key pattern: {sharded.pattern()}",
        code=SHARD_KEY_NOT_FOUND,
    )


def check_find_and_modify(
    cluster: Cluster, sharded: ShardedCollection, query: Mapping[str, Any], *, upsert: bool
) -> None:
    if upsert:
        if not _full_key(sharded, query):
            raise OperationFailure(UPSERT_NEEDS_KEY, code=SHARD_KEY_NOT_FOUND)
        return
    if not _one_shard(cluster, sharded, query):
        raise OperationFailure(FIND_AND_MODIFY_NEEDS_KEY, code=SHARD_KEY_NOT_FOUND)


def check_document(collection: Any, sharded: ShardedCollection, doc: Mapping[str, Any]) -> None:
    """A stored document: no array in its shard key, and (a task of a store with a layout) in
    its key's partition."""
    for name in sharded.fields:
        if isinstance(doc.get(name), list):
            raise WriteError(
                "Shard key cannot contain array values or array descendants.", SHARD_KEY_NOT_FOUND
            )
    partitions = _store_partitions(collection)
    if partitions is None or not isinstance(doc.get("_id"), str):
        return
    wanted = part_of(doc["_id"], partitions)
    if doc.get("part") != wanted:
        raise MisplacedTask(
            f"task {doc['_id']!r} placed in partition {doc.get('part')!r}, but its key belongs to partition "
            f"{wanted} of the store's {partitions} (a driver must read the store's layout before it writes)",
            code=None,
        )


def _store_partitions(collection: Any) -> int | None:
    """The partitions of the mscheduler store whose tasks collection this is (its layout
    document), or None."""
    if not collection.name.endswith(TASKS):
        return None
    prefix = collection.name[: -len(TASKS)]
    layout = collection.database.get_collection(f"{prefix}{META}").find_one({"_id": "layout"})
    return int(layout.get("partitions") or 1) if layout else None


def _shard_key_of(doc: Mapping[str, Any] | None, sharded: ShardedCollection) -> list[Any]:
    if doc is None:
        return []
    return [doc.get(name, _NO_VALUE) for name in sharded.fields]


def check_key_changes(
    collection: Any,
    sharded: ShardedCollection,
    before: Sequence[dict[str, Any]],
    query: Mapping[str, Any],
    *,
    multi: bool,
) -> None:
    """After an update: a document whose shard-key value changed is put back and the update
    refused, unless the query named the full shard key and the update was of one document."""
    changed = [
        doc
        for doc in before
        if _shard_key_of(collection._store[doc["_id"]], sharded) != _shard_key_of(doc, sharded)
    ]
    if not changed:
        return
    error: WriteError | None = None
    if not _full_key(sharded, query):
        error = WriteError(CHANGE_NEEDS_KEY, code=SHARD_KEY_UPDATE)
    elif multi:
        error = WriteError(MULTI_CHANGES_KEY, code=INVALID_OPTIONS)
    if error is None:
        try:
            for doc in changed:
                check_document(collection, sharded, collection._store[doc["_id"]])
            return
        except WriteError as refused:
            error = refused
    for doc in changed:
        collection._store[doc["_id"]] = doc
    raise error


# -- hooking the rules into mongomock ------------------------------------------------------------------

# the query of the findAndModify being run: its inner update and delete (by _id) are not routed again
_find_and_modify_query: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "find_and_modify_query", default=None
)
_applied = False


def apply() -> None:
    """Hook the rules into mongomock's collection and register the admin commands (idempotent;
    they act on the collections of a stand-in client only)."""
    global _applied
    if _applied:
        return
    _applied = True
    _hook_writes()
    _hook_indexes()
    mongomock_patches.ADMIN_COMMANDS.update(
        {
            "shardCollection": _shard_collection,
            "split": _split,
            "listShards": _list_shards,
            "addShardToZone": _add_shard_to_zone,
            "updateZoneKeyRange": _update_zone_key_range,
        }
    )


def _touched(collection: Any, spec: Mapping[str, Any], multi: bool) -> list[dict[str, Any]]:
    docs = [
        copy.deepcopy(d)
        for d in collection._iter_documents(helpers.patch_datetime_awareness_in_document(spec))
    ]
    return docs if multi else docs[:1]


def _hook_writes() -> None:
    update = Collection._update
    delete = Collection._delete
    find_and_modify = Collection._find_and_modify
    insert = Collection._insert

    def _update(
        self: Any,
        spec: Any,
        document: Any,
        upsert: bool = False,
        manipulate: bool = False,
        multi: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        found = _sharding(self)
        if found is None:
            return update(self, spec, document, upsert, manipulate, multi, *args, **kwargs)
        cluster, sharded = found
        outer = _find_and_modify_query.get()
        if outer is None:
            check_update(cluster, sharded, spec, document, upsert=upsert, multi=multi)
        before = _touched(self, spec, multi)
        result = update(self, spec, document, upsert, manipulate, multi, *args, **kwargs)
        check_key_changes(self, sharded, before, outer if outer is not None else spec, multi=multi)
        if result.get("upserted") is not None:
            try:
                check_document(self, sharded, self._store[result["upserted"]])
            except WriteError:
                del self._store[result["upserted"]]
                raise
        return result

    def _delete(self: Any, filter: Any, *args: Any, multi: bool = False, **kwargs: Any) -> Any:
        found = _sharding(self)
        if found is not None and _find_and_modify_query.get() is None:
            check_delete(*found, filter, multi=multi)
        return delete(self, filter, *args, multi=multi, **kwargs)

    def _find_and_modify(
        self: Any,
        query: Any,
        projection: Any = None,
        update: Any = None,
        upsert: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        found = _sharding(self)
        if found is None:
            return find_and_modify(self, query, projection, update, upsert, *args, **kwargs)
        check_find_and_modify(*found, query, upsert=upsert)
        token = _find_and_modify_query.set(query)
        try:
            return find_and_modify(self, query, projection, update, upsert, *args, **kwargs)
        finally:
            _find_and_modify_query.reset(token)

    def _insert(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        found = _sharding(self)
        if found is not None and isinstance(data, Mapping):
            check_document(self, found[1], data)
        return insert(self, data, *args, **kwargs)

    Collection._update = _update
    Collection._delete = _delete
    Collection._find_and_modify = _find_and_modify
    Collection._insert = _insert


def _hook_indexes() -> None:
    create_index = Collection.create_index

    def create(self: Any, keys: Any, *args: Any, **options: Any) -> Any:
        found = _sharding(self)
        if found is not None and options.get("unique"):
            _check_unique_index(found[1], helpers.create_index_list(keys), CANNOT_CREATE_INDEX)
        return create_index(self, keys, *args, **options)

    Collection.create_index = create


def _check_unique_index(sharded: ShardedCollection, keys: list[tuple[str, Any]], code: int) -> None:
    """A unique index of a sharded collection is prefixed by its shard key (or is ``_id``'s)."""
    names = [name for name, _ in keys]
    if names == ["_id"] or names[: len(sharded.fields)] == sharded.fields:
        return
    index = "{ " + ", ".join(f"{n}: {d}" for n, d in keys) + " }"
    if code == CANNOT_CREATE_INDEX:
        raise OperationFailure(
            f"cannot create unique index over {index} with shard key pattern {sharded.pattern()}", code=code
        )
    raise OperationFailure(
        f"can't shard collection '{sharded.namespace}' with unique index on {index} and proposed shard key "
        f"{sharded.pattern()}. Uniqueness can't be maintained unless shard key is a prefix",
        code=code,
    )


# -- admin commands ------------------------------------------------------------------------------


def _cluster(db: Any, name: str) -> Cluster:
    cluster: Cluster | None = getattr(db.client._store, "mongos", None)
    if cluster is None:
        raise OperationFailure(f"no such command: '{name}'", code=mongomock_patches.COMMAND_NOT_FOUND)
    if db.name != "admin":
        raise OperationFailure(f"{name} may only be run against the admin database.", code=UNAUTHORIZED)
    return cluster


def _collection_of(db: Any, namespace: str) -> Any:
    database, _, name = namespace.partition(".")
    return db.client.get_database(database).get_collection(name)


def _shard_collection(db: Any, command: dict[str, Any]) -> dict[str, Any]:
    cluster = _cluster(db, "shardCollection")
    namespace = command["shardCollection"]
    key = list(command["key"].items())
    existing = cluster.collections.get(namespace)
    if existing is not None:
        if existing.key != key:
            raise OperationFailure(
                f"sharding already enabled for collection {namespace}", ALREADY_INITIALIZED
            )
        return {"collectionsharded": namespace, "ok": 1.0}
    collection = _collection_of(db, namespace)
    sharded = ShardedCollection(namespace, key, cluster.shards)
    for _, info in collection._list_all_indexes():
        if info.get("unique"):
            _check_unique_index(sharded, list(info["key"]), INVALID_OPTIONS)
    fields = [name for name, _ in key]
    prefixed = any(
        [n for n, _ in info["key"]][: len(fields)] == fields for _, info in collection._list_all_indexes()
    )
    if not prefixed:
        if collection.count_documents({}):
            raise OperationFailure(
                "Please create an index that starts with the proposed shard key before sharding the "
                "collection",
                code=INVALID_OPTIONS,
            )
        collection.create_index(key)
    cluster.collections[namespace] = sharded
    return {"collectionsharded": namespace, "ok": 1.0}


def _sharded_collection(cluster: Cluster, namespace: str) -> ShardedCollection:
    sharded = cluster.collections.get(namespace)
    if sharded is None:
        raise OperationFailure(f"ns {namespace} is not sharded", code=118)
    return sharded


def _split(db: Any, command: dict[str, Any]) -> dict[str, Any]:
    cluster = _cluster(db, "split")
    sharded = _sharded_collection(cluster, command["split"])
    value = command["middle"][sharded.fields[0]]
    if value in sharded.boundaries:
        raise OperationFailure(f"split failed: {command['middle']} is already a chunk boundary", code=96)
    sharded.boundaries = sorted([*sharded.boundaries, value], key=_rank)
    return {"ok": 1.0}


def _list_shards(db: Any, command: dict[str, Any]) -> dict[str, Any]:
    cluster = _cluster(db, "listShards")
    return {
        "shards": [{"_id": s, "host": f"{s}/localhost:27018", "state": 1} for s in cluster.shards],
        "ok": 1.0,
    }


def _add_shard_to_zone(db: Any, command: dict[str, Any]) -> dict[str, Any]:
    cluster = _cluster(db, "addShardToZone")
    shard = command["addShardToZone"]
    if shard not in cluster.shards:
        raise OperationFailure(f"ShardNotFound: {shard} does not exist", code=SHARD_NOT_FOUND)
    members = cluster.zone_shards.setdefault(command["zone"], [])
    if shard not in members:
        members.append(shard)
    return {"ok": 1.0}


def _update_zone_key_range(db: Any, command: dict[str, Any]) -> dict[str, Any]:
    cluster = _cluster(db, "updateZoneKeyRange")
    sharded = _sharded_collection(cluster, command["updateZoneKeyRange"])
    first = sharded.fields[0]
    low, high, zone = command["min"][first], command["max"][first], command["zone"]
    if zone not in cluster.zone_shards:
        raise OperationFailure(f"zone {zone} does not exist", code=ILLEGAL_OPERATION)
    for other_low, other_high, _ in sharded.zones:
        if _before(low, other_high, strict=True) and _before(other_low, high, strict=True):
            raise OperationFailure(f"zone range overlaps [{other_low}, {other_high})", code=ILLEGAL_OPERATION)
    sharded.zones.append((low, high, zone))
    return {"ok": 1.0}
