"""The Mongo driver's event log: the ``<prefix>mscheduler_events`` collection, its
indexes, queries and change stream, and the recording of the events a store write causes.

A mixin placed first among ``MongoDriver``'s bases: with ``record_events`` on, its
``insert_tasks``, ``expire_leases``, ``expire_deadlines``, ``control_task`` and ``update_option``
wrap the task operations (``_insert_tasks_only``, ``_expire_leases_only``, ... in ``mongo.py``,
and ``MongoTaskQueries``' through ``super()``) and record what they changed; with it off they
are the task operations, command for command.

What each costs with events on (never a command on the claim path):

* ``insert_tasks``: one ``insert_many`` of ``sent`` events for the tasks it created (inside the
  caller's transaction when there is one, so a rolled-back send leaves no event);
* ``expire_leases`` / ``expire_deadlines``: one read of what is expired *before* the update (the
  update is skipped when it finds nothing, so an idle pass costs the same one command), then one
  insert. Several consumers' passes may read the same entry: the event ids are deterministic
  (``key|attempt|lease_lost``, ``key|expired|<deadline>``), so it is stored once;
* ``control_task``: one insert (the changed or deleted task, returned by the write, names
  itself); ``update_option``: one read of the task's name and one insert.

Indexes (every read names its index):

================== ===================================== ======================================
``events_ttl``      ``time`` (TTL: ``event_retention``)    the retention (a real server deletes)
``events_order``    ``time, step, seq, _id``               ``list_events()`` in time order
``events_task``     ``key, time, step, seq, _id``          one task's history
``events_written``  ``written, _id``                       a poller's position (no change stream)
================== ===================================== ======================================
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import WriteConcern
from pymongo.errors import BulkWriteError, OperationFailure, PyMongoError

from mscheduler.domain.events import (
    CONTROL_KINDS,
    EventKind,
    EventWriter,
    expired_event,
    lost_lease_event,
    sent_detail,
    task_event,
)
from mscheduler.domain.exceptions import InvalidInput, StorageError
from mscheduler.domain.partitions import part_of
from mscheduler.drivers.base import (
    ControlParams,
    EventQuery,
    EventStream,
    ExpireParams,
    InsertEventsParams,
    InsertParams,
    UpdateOptionParams,
    control_detail,
    settlement,
)
from mscheduler.drivers.mongo.common import (
    ADMIN_READ_MS,
    CONFIG_CODES,
    DEADLINE_INDEX,
    LEASES_INDEX,
    WORKER_STATES,
    T,
    WriteMayRollBack,
    admin_read,
    from_mongo,
    is_transient,
    log,
    may_roll_back,
    resolved,
    to_mongo,
    watch_error,
    write_concern_codes,
)
from mscheduler.drivers.mongo.indexes import ensure_indexes

EVENTS = "mscheduler_events"
EVENTS_TTL_INDEX = "events_ttl"
EVENTS_TIME_INDEX = "events_order"
EVENTS_KEY_INDEX = "events_task"
EVENTS_WRITTEN_INDEX = "events_written"
_INDEX_NOT_FOUND = 27
_INDEX_OPTIONS_CONFLICT = frozenset({85, 86})  # IndexOptionsConflict, IndexKeySpecsConflict
UNAUTHORIZED = 13
# besides the TTL index (its period comes from the driver's event_retention)
EVENT_INDEXES: list[tuple[Any, dict[str, Any]]] = [
    ([("time", 1), ("step", 1), ("seq", 1), ("_id", 1)], {"name": EVENTS_TIME_INDEX}),
    ([("key", 1), ("time", 1), ("step", 1), ("seq", 1), ("_id", 1)], {"name": EVENTS_KEY_INDEX}),
    ([("written", 1), ("_id", 1)], {"name": EVENTS_WRITTEN_INDEX}),
]


def events_collection(database: Any, prefix: str, concern: WriteConcern | None) -> Any:
    """The events collection, with the tasks' write concern."""
    events = database[f"{prefix}{EVENTS}"]
    return events.with_options(write_concern=concern) if concern is not None else events


def _stored(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A stored event as the drivers hand it out: ``_id`` as ``id``, aware datetimes."""
    out = from_mongo(dict(doc))
    out["id"] = out.pop("_id")
    out.setdefault("detail", {})
    return dict(out)


def _filter(query: EventQuery, prefix: str = "") -> dict[str, Any]:
    """The query's filters on event fields (``prefix``: ``fullDocument.`` in a change stream)."""
    filter_: dict[str, Any] = {}
    for field, values in (
        ("key", query.keys),
        ("name", query.names),
        ("kind", query.kinds),
        ("plan_id", query.plan_ids),
    ):
        if values:
            filter_[prefix + field] = {"$in": list(values)}
    if query.worker_id is not None:
        filter_[prefix + "worker_id"] = query.worker_id
    return filter_


class _MongoEventStream:
    """A change stream on the events collection: inserts only, as stored events."""

    def __init__(self, stream: Any, token: Any) -> None:
        self._stream = stream
        self.resume_token: Any = token

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            try:
                change = await self._stream.try_next()
            except OperationFailure as exc:
                raise watch_error(exc, self.resume_token) from exc
            except PyMongoError as exc:
                raise StorageError(f"event stream broke: {exc}", transient=True) from exc
            token = self._stream.resume_token
            if change is None:
                if not self._stream.alive:
                    return
                if token is not None:
                    self.resume_token = token
                continue
            self.resume_token = token
            doc = change.get("fullDocument")
            if isinstance(doc, dict) and "_id" in doc:
                yield _stored(doc)

    async def aclose(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            await resolved(close())


class MongoEvents:
    """Event operations of ``MongoDriver`` (a mixin, first among its bases; see the module)."""

    events: Any
    tasks: Any
    tasks_primary: Any
    record_events: bool
    event_writer: EventWriter
    event_retention: timedelta

    if TYPE_CHECKING:

        @property
        def partitions(self) -> int: ...

        async def _call(
            self,
            what: str,
            operation: Callable[[], Awaitable[T]],
            *,
            recover: Callable[[], Awaitable[T | None]] | None = None,
            session: Any = None,
        ) -> T: ...

        async def _insert_tasks_only(self, params: InsertParams) -> list[int | None]: ...

        async def _expire_leases_only(self, params: ExpireParams, part: int = 0) -> int: ...

        async def _expire_history_leases(self, params: ExpireParams, part: int = 0) -> int: ...

        async def _expire_deadlines_only(self, params: ExpireParams, part: int = 0) -> int: ...

    def _init_events(
        self, database: Any, prefix: str, concern: WriteConcern | None, record: bool, retention: timedelta
    ) -> None:
        if not isinstance(retention, timedelta) or retention < timedelta(minutes=1):
            raise InvalidInput("event_retention must be a timedelta of at least a minute")
        self.events = events_collection(database, prefix, concern)
        self.record_events = record
        self.event_writer = EventWriter()  # the events this store's own writes cause
        self.event_retention = retention

    async def _create_event_indexes(self) -> None:
        """The event indexes, when events are recorded; a changed retention is applied to the
        existing TTL index (``collMod``)."""
        if not self.record_events:
            return
        ttl = int(self.event_retention.total_seconds())

        async def create_ttl() -> None:
            await self.events.create_index([("time", 1)], name=EVENTS_TTL_INDEX, expireAfterSeconds=ttl)

        async def create() -> None:
            try:
                await create_ttl()
            except OperationFailure as exc:
                if exc.code not in _INDEX_OPTIONS_CONFLICT:
                    raise
                command = {
                    "collMod": self.events.name,
                    "index": {"name": EVENTS_TTL_INDEX, "expireAfterSeconds": ttl},
                }
                try:
                    await self.events.database.command(command)
                except OperationFailure as refused:
                    # the readWrite role has no collMod (Unauthorized, SERVER-20772): build the TTL
                    # index again with the new period (the log keeps its events meanwhile)
                    if refused.code != UNAUTHORIZED:
                        raise
                    log.warning("no collMod right: rebuilding %s with the new retention", EVENTS_TTL_INDEX)
                    await self.events.drop_index(EVENTS_TTL_INDEX)
                    await create_ttl()
            await ensure_indexes(self.events, EVENT_INDEXES)

        await self._call("create event indexes", create)

    # -- writing ----------------------------------------------------------------------------------

    async def insert_events(self, params: InsertEventsParams) -> int:
        """One unordered ``insert_many``; ids already stored (E11000) are skipped."""
        if not params.events:
            return 0
        # Aware datetimes as they are: PyMongo encodes an aware time as the UTC milliseconds BSON
        # stores, the same bytes as the naive UTC time (no walk of every event here).
        written = params.now
        docs = [{"_id": e["id"], **e, "written": written} for e in params.events]
        for doc in docs:
            del doc["id"]
        extra = {"session": params.session} if params.session is not None else {}

        earlier: set[int] = set()  # stored by a try whose primary then stepped down

        async def insert() -> int:
            try:
                result = await self.events.insert_many(docs, ordered=False, **extra)
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors", [])
                if any(err.get("code") != 11000 for err in errors) or write_concern_codes(exc) & CONFIG_CODES:
                    raise
                existing = {err["index"] for err in errors}
                applied = set(range(len(docs))) - existing
                if params.session is None and may_roll_back(exc):
                    # the primary stepped down: the events may roll back, stored again (an
                    # earlier try's that survived is a known id: skipped, still new)
                    earlier.update(applied)
                    raise WriteMayRollBack(f"insert events: {exc.details['writeConcernErrors']}") from exc
                return len(applied | (earlier & existing))
            return len(result.inserted_ids)

        return await self._call("insert events", insert, session=params.session)

    async def _record(self, docs: Sequence[Mapping[str, Any]], now: datetime, session: Any = None) -> None:
        if self.record_events and docs:
            await self.insert_events(InsertEventsParams(docs, now, session))

    async def insert_tasks(self, params: InsertParams) -> list[bool]:
        generations = await self._insert_tasks_only(params)
        if self.record_events:
            sent = [
                task_event(
                    self.event_writer,
                    EventKind.SENT,
                    t.key,
                    t.name,
                    params.now,
                    {"generation": g},
                    sent_detail(params.by, g > 0),
                )
                for t, g in zip(params.tasks, generations, strict=True)
                if g is not None
            ]
            await self._record(sent, params.now, params.session)
        return [g is not None for g in generations]

    async def expire_leases(self, params: ExpireParams) -> int:
        """The lease pass, one partition (one shard) at a time."""
        return sum([await self._expire_leases_part(params, part) for part in range(self.partitions)])

    async def _expire_leases_part(self, params: ExpireParams, part: int) -> int:
        if not self.record_events:
            return await self._expire_leases_only(params, part)
        now = to_mongo(params.now)
        filter_ = {
            "part": part,
            WORKER_STATES: {"$elemMatch": {"status": "running", "ping_expire_time": {"$lte": now}}},
        }
        projection = {
            "_id": 0,
            "key": 1,
            "name": 1,
            f"{WORKER_STATES}.worker_id": 1,
            f"{WORKER_STATES}.attempt": 1,
            f"{WORKER_STATES}.status": 1,
            f"{WORKER_STATES}.ping_expire_time": 1,
            "state.cancelled": 1,
            "state.stop": 1,
            "state.generation": 1,
        }

        async def read() -> list[dict[str, Any]]:
            cursor = self.tasks_primary.find(filter_, projection).hint(LEASES_INDEX)
            return [from_mongo(doc) async for doc in cursor]

        docs = await self._call("expire leases (read for events)", read)
        if not docs:  # nothing expired at this ``now``: the update would change nothing
            return await self._expire_history_leases(params, part)
        events = []
        for doc in docs:
            state = doc.get("state", {})
            for position, entry in enumerate(state.get("worker_states", [])):
                end = entry.get("ping_expire_time")
                if entry.get("status") != "running" or not isinstance(end, datetime) or end > params.now:
                    continue
                if settlement(state, entry["attempt"]) is None:  # a stopped attempt is no loss
                    generation = int(state.get("generation") or 0)
                    lost = lost_lease_event(
                        self.event_writer,
                        doc["key"],
                        doc["name"],
                        entry,
                        position + 1,
                        params.now,
                        "lease pass",
                        generation,
                        len(state.get("worker_states", [])),
                    )
                    events.append(lost)
        expired = await self._expire_leases_only(params, part)
        await self._record(events, params.now)
        return expired

    async def expire_deadlines(self, params: ExpireParams) -> int:
        """The deadline pass, one partition (one shard) at a time."""
        return sum([await self._expire_deadlines_part(params, part) for part in range(self.partitions)])

    async def _expire_deadlines_part(self, params: ExpireParams, part: int) -> int:
        if not self.record_events:
            return await self._expire_deadlines_only(params, part)
        filter_ = {"part": part, "state.status": "pending", "option.deadline": {"$lte": to_mongo(params.now)}}

        projection = {
            "_id": 0,
            "key": 1,
            "name": 1,
            "option.deadline": 1,
            "state.generation": 1,
            f"{WORKER_STATES}.attempt": 1,
        }

        async def read() -> list[dict[str, Any]]:
            cursor = self.tasks_primary.find(filter_, projection)
            return [from_mongo(doc) async for doc in cursor.hint(DEADLINE_INDEX)]

        docs = await self._call("expire deadlines (read for events)", read)
        if not docs:
            return 0
        expired = await self._expire_deadlines_only(params, part)
        events = [
            expired_event(
                self.event_writer,
                d["key"],
                d["name"],
                d["option"]["deadline"],
                params.now,
                d.get("state", {}),
            )
            for d in docs
        ]
        await self._record(events, params.now)
        return expired

    async def _task_name(self, key: str) -> dict[str, Any] | None:
        """The task's name and where an event about it stands (generation, its attempts)."""
        projection = {"_id": 0, "name": 1, "state.generation": 1, f"{WORKER_STATES}.attempt": 1}
        doc: dict[str, Any] | None = await self._call(
            "read task name",
            lambda: self.tasks.find_one({"key": key, "part": part_of(key, self.partitions)}, projection),
        )
        return doc

    async def control_task(self, params: ControlParams) -> dict[str, Any] | None:
        kind = CONTROL_KINDS.get(params.action)
        after: dict[str, Any] | None = await super().control_task(params)  # type: ignore[misc]
        if after is not None and self.record_events and kind is not None:
            # the changed (or deleted) task names itself: no read before the write
            detail = control_detail(params)
            event = task_event(
                self.event_writer, kind, params.key, after["name"], params.now, after["state"], detail
            )
            await self._record([event], params.now)
        return after

    async def update_option(self, params: UpdateOptionParams) -> bool:
        applied = bool(await super().update_option(params))  # type: ignore[misc]
        if applied and self.record_events:
            doc = await self._task_name(params.key)
            if doc is not None:
                edited = task_event(
                    self.event_writer,
                    EventKind.EDITED,
                    params.key,
                    doc["name"],
                    params.now,
                    doc.get("state", {}),
                    {"by": params.by} if params.by else None,
                )
                await self._record([edited], params.now)
        return applied

    # -- reading ----------------------------------------------------------------------------------

    async def list_events(self, query: EventQuery) -> list[dict[str, Any]]:
        filter_ = _filter(query)
        time: dict[str, Any] = {}
        if query.time_from is not None:
            time["$gte"] = to_mongo(query.time_from)
        if query.time_to is not None:
            time["$lt"] = to_mongo(query.time_to)
        if time:
            filter_["time"] = time
        if query.written_from is not None:
            filter_["written"] = {"$gte": to_mongo(query.written_from)}
        if query.after is not None:
            written, event_id = to_mongo(query.after[0]), query.after[1]
            filter_["$or"] = [{"written": {"$gt": written}}, {"written": written, "_id": {"$gt": event_id}}]
        if query.by_written:
            order, index = [("written", 1), ("_id", 1)], EVENTS_WRITTEN_INDEX
        elif query.keys:
            order, index = [("time", 1), ("step", 1), ("seq", 1), ("_id", 1)], EVENTS_KEY_INDEX
        else:
            order, index = [("time", 1), ("step", 1), ("seq", 1), ("_id", 1)], EVENTS_TIME_INDEX

        async def read() -> list[dict[str, Any]]:
            cursor = self.events.find(filter_).sort(order).skip(query.skip).limit(query.limit)
            if self.record_events:  # the indexes exist only where events are recorded
                cursor = cursor.hint(index)
            return [_stored(doc) async for doc in cursor.max_time_ms(ADMIN_READ_MS)]

        return await self._call("list events", lambda: admin_read("list events", read))

    async def open_event_stream(self, query: EventQuery, resume_token: Any = None) -> EventStream:
        match = {"operationType": "insert", **_filter(query, "fullDocument.")}
        kwargs: dict[str, Any] = {"resume_after": resume_token} if resume_token is not None else {}
        try:
            stream = await resolved(self.events.watch([{"$match": match}], **kwargs))
        except OperationFailure as exc:
            raise watch_error(exc, resume_token) from exc
        except PyMongoError as exc:
            raise StorageError(f"watching events failed: {exc}", transient=is_transient(exc)) from exc
        log.debug("event stream opened (resume token: %s)", resume_token is not None)
        return _MongoEventStream(stream, resume_token)
