"""MongoDB driver: the ONLY module with collection names, filters, updates, indexes and streams.

It takes an async database object — PyMongo's ``AsyncDatabase`` (production), or a Motor /
mongomock-motor database (tests) — and absorbs their API differences in one place (``aggregate``,
``watch`` and ``list_indexes`` are coroutines in PyMongo's async API, plain calls elsewhere).

Query design:

* Every state change is one single-document update whose filter is the compare-and-set (fencing by
  ``worker_id`` + ``attempt`` + a running, unexpired entry), followed by the same pipeline stages
  that recompute the derived fields (``mscheduler.state``), so derived state never drifts.
* The claim is one ``find_one_and_update`` served by the index ``claim`` (name, priority desc,
  targeted desc, claim_at asc); ``claim_at`` is null for tasks with no free slot or that are
  finished, so finished and full tasks are not in the scanned range.
* No ``$$NOW``: times come from the caller's server-corrected clock. No date arithmetic inside
  pipelines either (mongomock cannot ``$add`` dates): expiry and retry times are computed by the
  caller. No ``arrayFilters``: entries change through ``$map`` or the positional ``$``.
* Literal values in pipelines are wrapped in ``$literal`` so that user data (results, errors)
  can never be read as field paths or operators.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pymongo import ReturnDocument, UpdateOne
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)

from mscheduler.drivers.base import (
    ENTRY_FIELDS,
    ChangeEvent,
    ChangeStreamUnsupported,
    ClaimedTask,
    ClaimParams,
    ExpireParams,
    FinishParams,
    InsertParams,
    ListParams,
    PingParams,
    PingResult,
    UpdateOptionParams,
    Wakeup,
    WakeupParams,
    WorkerInfo,
    allowed,
    event_for,
    new_entry,
    new_task_document,
)
from mscheduler.exceptions import StorageError

log = logging.getLogger("mscheduler.mongo")

T = TypeVar("T")

TASKS = "mscheduler_tasks"
WORKERS = "mscheduler_workers"

WS = "state.worker_states"
TRANSIENT_ERRORS = (AutoReconnect, ConnectionFailure, NetworkTimeout, NotPrimaryError, ExecutionTimeout)
# Server codes that a retry may fix: interrupted / shutting down / not primary / write conflict.
TRANSIENT_CODES = frozenset({6, 7, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})
CHANGE_STREAM_UNSUPPORTED_CODES = frozenset({40573, 40415, 303, 115})


# -- datetimes: naive UTC on the wire (mongomock compares naive), aware UTC everywhere else ----


def _out(value: Any) -> Any:
    """Convert aware datetimes to naive UTC, recursively, for filters and updates."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, dict):
        return {k: _out(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_out(v) for v in value]
    return value


def _in(value: Any) -> Any:
    """Make every datetime read from the database aware (UTC)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, dict):
        return {k: _in(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_in(v) for v in value]
    return value


def _lit(value: Any) -> dict[str, Any]:
    return {"$literal": _out(value)}


# -- pipeline pieces ------------------------------------------------------------------------------


def _count(statuses: Sequence[str]) -> dict[str, Any]:
    cond = (
        {"$eq": ["$$e.status", statuses[0]]}
        if len(statuses) == 1
        else {"$in": ["$$e.status", list(statuses)]}
    )
    return {"$size": {"$filter": {"input": f"${WS}", "as": "e", "cond": cond}}}


_FAILURE_STATUSES = ["failed", "lost", "rejected"]


def _derive_stages(now: datetime) -> list[dict[str, Any]]:
    """``mscheduler.state.derive`` as update-pipeline stages."""
    cnt = "$option.concurrent_worker_cnt"
    finished = {"$gte": ["$state.success_cnt", cnt]}
    exhausted = {
        "$or": [
            {"$gt": ["$state.fail_cnt", "$option.max_unexpected_retries"]},
            {"$gt": ["$state.rejected_cnt", 0]},
        ]
    }
    busy = {"$add": ["$state.running_cnt", "$state.success_cnt"]}
    return [
        {
            "$set": {
                "state.running_cnt": _count(["running"]),
                "state.success_cnt": _count(["succeeded"]),
                "state.fail_cnt": _count(_FAILURE_STATUSES),
                "state.rejected_cnt": _count(["rejected"]),
                # Only failures set the retry time (as in derive): first the failures' retry_at
                # (null for other entries), reduced by the next stage's $max over a field path,
                # the form mongomock evaluates too.
                "state.retry_at": {
                    "$map": {
                        "input": f"${WS}",
                        "as": "e",
                        "in": {"$cond": [{"$in": ["$$e.status", _FAILURE_STATUSES]}, "$$e.retry_at", None]},
                    }
                },
                "state.targeted": {"$gt": [{"$size": "$option.specific_worker_ids"}, 0]},
                "state.update_time": _lit(now),
            }
        },
        {"$set": {"state.retry_at": {"$max": "$state.retry_at"}}},
        {
            "$set": {
                "state.free_slots": {"$max": [0, {"$subtract": [cnt, busy]}]},
                "state.status": {
                    "$switch": {
                        "branches": [
                            {"case": finished, "then": "succeeded"},
                            {
                                "case": {"$and": [exhausted, {"$eq": ["$state.running_cnt", 0]}]},
                                "then": "failed",
                            },
                            {"case": {"$gt": ["$state.running_cnt", 0]}, "then": "running"},
                        ],
                        "default": "pending",
                    }
                },
                "state.claim_at": {
                    "$cond": [
                        {"$or": [finished, exhausted, {"$gte": [busy, cnt]}]},
                        None,
                        {"$max": ["$option.run_at", "$state.retry_at"]},
                    ]
                },
            }
        },
    ]


def _rebuild_entries(match: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A ``$set`` of worker_states where entries matching ``match`` get ``changes`` (literals)."""
    rebuilt = {f: (_lit(changes[f]) if f in changes else f"$$e.{f}") for f in ENTRY_FIELDS}
    return {"$set": {WS: {"$map": {"input": f"${WS}", "as": "e", "in": {"$cond": [match, rebuilt, "$$e"]}}}}}


def _is_transient(exc: PyMongoError) -> bool:
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    if isinstance(exc, WriteConcernError):
        return True
    if isinstance(exc, OperationFailure) and exc.code in TRANSIENT_CODES:
        return True
    return bool(getattr(exc, "has_error_label", lambda _: False)("RetryableWriteError"))


async def _resolve(value: Any) -> Any:
    """PyMongo async returns coroutines where Motor returns cursors: accept both."""
    return await value if inspect.isawaitable(value) else value


class MongoDriver:
    """The task store on MongoDB.

    :param database: an async database (``AsyncMongoClient()[name]``; Motor or mongomock-motor
        objects work too).
    :param prefix: collection name prefix, to keep several independent schedulers in one database.
    :param retries: how many times a transient error is retried (with jittered exponential
        backoff) before it surfaces as ``StorageError(transient=True)``.
    """

    def __init__(
        self,
        database: Any,
        *,
        prefix: str = "",
        retries: int = 5,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
        majority: bool | None = None,
    ) -> None:
        self.database = database
        tasks = database[f"{prefix}{TASKS}"]
        workers = database[f"{prefix}{WORKERS}"]
        if majority is None:  # majority writes survive a failover; the fake has no replicas
            majority = not any("mongomock" in cls.__module__ for cls in type(database).__mro__)
        if majority:
            from pymongo import WriteConcern

            tasks = tasks.with_options(write_concern=WriteConcern(w="majority"))
            workers = workers.with_options(write_concern=WriteConcern(w="majority"))
        self.tasks = tasks
        self.workers = workers
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.commands = 0  # storage commands sent (benchmarks count them)

    # -- plumbing ---------------------------------------------------------------------------------

    async def _call(
        self,
        what: str,
        operation: Callable[[], Awaitable[T]],
        *,
        recover: Callable[[], Awaitable[T | None]] | None = None,
    ) -> T:
        """Run one command, retrying transient errors with backoff; translate the rest.

        ``recover`` is asked after a transient error whose outcome is unknown (the write may have
        been applied before the reply was lost); if it finds the effect, that is the answer.
        """
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                self.commands += 1
                return await operation()
            except DuplicateKeyError:
                raise
            except PyMongoError as exc:
                if not _is_transient(exc):
                    raise StorageError(f"{what} failed: {exc}") from exc
                if attempt == self.retries:
                    raise StorageError(
                        f"{what} failed after {attempt + 1} tries: {exc}", transient=True
                    ) from exc
                log.warning("%s: transient error (%s), retrying in %.2fs", what, exc, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_backoff)
                if recover is not None:
                    found = await self._call(f"{what} (recovery read)", recover)
                    if found is not None:
                        return found
        raise AssertionError("unreachable")

    async def setup(self) -> None:
        """Create the indexes (idempotent)."""

        async def create() -> None:
            await self.tasks.create_index("key", unique=True, name="key")
            await self.tasks.create_index(
                [("name", 1), ("option.priority", -1), ("state.targeted", -1), ("state.claim_at", 1)],
                name="claim",
            )
            await self.tasks.create_index([(f"{WS}.status", 1), (f"{WS}.ping_expire_time", 1)], name="leases")
            await self.tasks.create_index(f"{WS}.attempt", name="attempt")
            await self.tasks.create_index([("state.status", 1), ("state.update_time", 1)], name="status")

        await self._call("create indexes", create)

    @property
    def namespace(self) -> str:
        """``database.collection`` of the tasks, for reports."""
        return f"{self.tasks.database.name}.{self.tasks.name}"

    async def drop(self) -> None:
        """Drop this scheduler's collections (the demo cleans up with it)."""
        await self._call("drop tasks", self.tasks.drop)
        await self._call("drop workers", self.workers.drop)

    async def index_names(self) -> list[str]:
        cursor = await _resolve(self.tasks.list_indexes())
        return [ix["name"] async for ix in cursor]

    async def server_time(self) -> datetime | None:
        async def hello() -> datetime | None:
            try:
                reply = await self.database.command("hello")
            except OperationFailure:
                return None
            local = reply.get("localTime")
            return _in(local) if isinstance(local, datetime) else None

        try:
            return await self._call("hello", hello)
        except (StorageError, NotImplementedError):
            return None

    async def server_info(self) -> dict[str, Any]:
        """What ``mscheduler check`` reports: replica set, version, change-stream support."""
        info: dict[str, Any] = {}
        try:
            hello = await self.database.command("hello")
            info["replica_set"] = hello.get("setName")
            info["is_primary"] = hello.get("isWritablePrimary")
        except Exception as exc:
            info["hello_error"] = str(exc)
        try:
            build = await self.database.command("buildInfo")
            info["version"] = build.get("version")
        except Exception as exc:
            info["version_error"] = str(exc)
        return info

    # -- publish ------------------------------------------------------------------------------------

    async def insert_tasks(self, params: InsertParams) -> list[bool]:
        created = [False] * len(params.tasks)
        pending = list(range(len(params.tasks)))
        if params.reset_finished:
            pending = []
            for i, task in enumerate(params.tasks):
                if await self._reset_finished(task, params):
                    created[i] = True
                else:
                    pending.append(i)
        if not pending:
            return created
        docs = [_out(new_task_document(params.tasks[i], params.now)) for i in pending]

        async def insert() -> set[int]:
            # Duplicate keys are handled here, inside the operation: BulkWriteError is a
            # PyMongoError, so ``_call`` would otherwise turn it into a StorageError.
            try:
                await self.tasks.insert_many(docs, ordered=False, session=params.session)
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors", [])
                if any(err.get("code") != 11000 for err in errors):
                    raise
                return {err["index"] for err in errors}
            return set()

        failed = await self._call("insert tasks", insert)
        for position, i in enumerate(pending):
            created[i] = position not in failed
        return created

    async def _reset_finished(self, task: Any, params: InsertParams) -> bool:
        doc = new_task_document(task, params.now)
        state = dict(doc["state"])
        state.pop("create_time")
        update = {
            "$set": _out(
                {"params": doc["params"], "option": doc["option"]}
                | {f"state.{k}": v for k, v in state.items()}
            )
        }

        async def reset() -> Any:
            return await self.tasks.update_one(
                {"key": task.key, "state.status": {"$in": ["succeeded", "failed"]}},
                update,
                session=params.session,
            )

        result = await self._call("reset task", reset)
        return bool(result.modified_count)

    # -- claim / ping / finish --------------------------------------------------------------------

    def _claim_filter(self, params: ClaimParams) -> dict[str, Any]:
        now = _out(params.now)
        filter_: dict[str, Any] = {
            "name": {"$in": list(params.names)},
            "state.claim_at": {"$lte": now},
            "state.free_slots": {"$gt": 0},
            "state.status": {"$in": ["pending", "running"]},
            "$or": [
                {"option.specific_worker_ids": {"$size": 0}},
                {"option.specific_worker_ids": params.worker_id},
            ],
            "$nor": [
                {
                    WS: {
                        "$elemMatch": {
                            "worker_id": params.worker_id,
                            "status": {"$in": ["running", "succeeded"]},
                        }
                    }
                }
            ],
        }
        if params.exclude_keys:
            filter_["key"] = {"$nin": list(params.exclude_keys)}
        return filter_

    async def _claim_one(self, params: ClaimParams, attempt: str) -> ClaimedTask | None:
        entry = _out(new_entry(params, attempt, params.expire))
        # An object inside an array is an expression too; its strings are ids and constants
        # (validated not to start with '$'), so it is written as is: mongomock does not evaluate
        # $literal inside arrays.
        if any(isinstance(v, str) and v.startswith("$") for v in entry.values()):
            raise StorageError(f"refusing a worker entry with '$'-prefixed values: {entry}")
        pipeline = [{"$set": {WS: {"$concatArrays": [f"${WS}", [entry]]}}}, *_derive_stages(params.now)]
        filter_ = self._claim_filter(params)
        sort = [("option.priority", -1), ("state.targeted", -1), ("state.claim_at", 1)]

        async def claim() -> dict[str, Any] | None:
            doc: dict[str, Any] | None = await self.tasks.find_one_and_update(
                filter_, pipeline, sort=sort, return_document=ReturnDocument.AFTER
            )
            return doc

        async def recover() -> dict[str, Any] | None:
            # The reply was lost: if our attempt token is stored, the claim was applied.
            doc: dict[str, Any] | None = await self.tasks.find_one({f"{WS}.attempt": attempt})
            return doc

        doc = await self._call("claim", claim, recover=recover)
        if doc is None:
            return None
        doc = _in(doc)
        entries = doc["state"]["worker_states"]
        position = next(i for i, e in enumerate(entries) if e["attempt"] == attempt)
        return ClaimedTask(
            key=doc["key"],
            name=doc["name"],
            params=doc.get("params"),
            option=doc["option"],
            attempt=attempt,
            attempt_no=position + 1,
            ping_expire_time=entries[position]["ping_expire_time"],
        )

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """Up to ``len(params.attempts)`` claims, sent concurrently (one round trip each)."""
        if len(params.attempts) == 1:
            one = await self._claim_one(params, params.attempts[0])
            return [one] if one is not None else []
        results = await asyncio.gather(
            *(self._claim_one(params, a) for a in params.attempts), return_exceptions=True
        )
        claimed = [r for r in results if isinstance(r, ClaimedTask)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors and not claimed:
            raise errors[0]
        if errors:
            # Raising would orphan the claims that were applied (their leases would expire unused,
            # each costing a retry): hand those over; the next claim meets the error again.
            log.warning("claim: %d of %d attempts failed (%s)", len(errors), len(results), errors[0])
        return claimed

    async def ping(self, params: PingParams) -> PingResult:
        now = _out(params.now)
        every_key: dict[str, str] = {}
        for expire, attempts in params.groups.items():
            every_key.update(attempts)
            filter_ = {
                "key": {"$in": list(attempts)},
                WS: {
                    "$elemMatch": {
                        "worker_id": params.worker_id,
                        "attempt": {"$in": list(attempts.values())},
                        "status": "running",
                        "ping_expire_time": {"$gt": now},
                    }
                },
                "$or": [
                    {"option.specific_worker_ids": {"$size": 0}},
                    {"option.specific_worker_ids": params.worker_id},
                ],
            }
            # A $map, not the positional "$": when a filter matches two arrays (here also
            # specific_worker_ids) "$" may resolve to the other array's index (SERVER-5247).
            tokens = list(attempts.values())
            if any(t.startswith("$") for t in tokens):
                raise StorageError("attempt tokens must not start with '$'")
            match = {
                "$and": [
                    {"$eq": ["$$e.worker_id", _lit(params.worker_id)]},
                    {"$in": ["$$e.attempt", tokens]},
                    {"$eq": ["$$e.status", "running"]},
                    {"$gt": ["$$e.ping_expire_time", _lit(now)]},
                ]
            }
            update = [_rebuild_entries(match, {"ping_expire_time": expire})]

            async def ping_group(
                filter_: dict[str, Any] = filter_, update: list[dict[str, Any]] = update
            ) -> Any:
                return await self.tasks.update_many(filter_, update)

            await self._call("ping", ping_group)

        async def read() -> list[dict[str, Any]]:
            cursor = self.tasks.find(
                {"key": {"$in": list(every_key)}},
                # The whole array: MongoDB refuses an $elemMatch projection on a nested field
                # (error 31275) and mongomock returns nothing for it; the entry is picked below.
                {"key": 1, "option": 1, WS: 1},
            )
            return [_in(doc) async for doc in cursor]

        docs = {doc["key"]: doc for doc in await self._call("ping read", read)}
        expires = {key: expire for expire, group in params.groups.items() for key in group}
        result = PingResult()
        for key, attempt in every_key.items():
            doc = docs.get(key)
            entries = (doc or {}).get("state", {}).get("worker_states", [])
            entry = next(
                (
                    e
                    for e in entries
                    if e["worker_id"] == params.worker_id
                    and e["attempt"] == attempt
                    and e["status"] == "running"
                ),
                None,
            )
            if doc is None or entry is None:
                result.lost.append(key)
            elif entry["ping_expire_time"] == expires[key] and allowed(doc["option"], params.worker_id):
                # extended (or already at the asked expiry: a ping in the same millisecond as
                # the claim); a revoked entry is never extended, whatever its expiry says
                result.alive[key] = doc["option"]
            elif entry["ping_expire_time"] <= params.now:
                result.lost.append(key)
            elif not allowed(doc["option"], params.worker_id):
                result.revoked.append(key)
            else:
                # Still ours and unexpired but not extended: a concurrent change; try next time.
                result.alive[key] = doc["option"]
        return result

    def _finish_op(self, item: FinishParams) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        now = _out(item.now)
        filter_ = {
            "key": item.key,
            WS: {
                "$elemMatch": {
                    "worker_id": item.worker_id,
                    "attempt": item.attempt,
                    "status": "running",
                    "ping_expire_time": {"$gt": now},
                }
            },
        }
        match = {
            "$and": [
                {"$eq": ["$$e.attempt", _lit(item.attempt)]},
                {"$eq": ["$$e.worker_id", _lit(item.worker_id)]},
                {"$eq": ["$$e.status", "running"]},
            ]
        }
        changes = {
            "status": item.outcome,
            "end_time": item.now,
            "result": item.result,
            "error": item.error,
            "retry_at": item.retry_at,
        }
        return filter_, [_rebuild_entries(match, changes), *_derive_stages(item.now)]

    async def finish(self, params: Sequence[FinishParams]) -> list[bool]:
        """Write a batch of attempt outcomes in one command; says which were accepted (fenced)."""
        if not params:
            return []
        ops = [self._finish_op(item) for item in params]

        async def write() -> Any:
            if len(ops) == 1:
                return await self.tasks.update_one(ops[0][0], ops[0][1])
            return await self.tasks.bulk_write([UpdateOne(f, u) for f, u in ops], ordered=False)

        try:
            result = await self._call("finish", write)
            matched = result.matched_count
        except StorageError as exc:
            if not exc.transient:
                raise
            matched = -1  # outcome unknown: read back below
        if matched == len(ops):
            return [True] * len(ops)
        # Some were rejected (lease lost) or the outcome is unknown: read back which ones landed.
        return await self._finish_outcomes(params)

    async def _finish_outcomes(self, params: Sequence[FinishParams]) -> list[bool]:
        keys = list({item.key for item in params})

        async def read() -> list[dict[str, Any]]:
            cursor = self.tasks.find({"key": {"$in": keys}}, {"key": 1, WS: 1})
            return [doc async for doc in cursor]

        docs = {doc["key"]: doc for doc in await self._call("finish read-back", read)}
        outcomes = []
        for item in params:
            entries = docs.get(item.key, {}).get("state", {}).get("worker_states", [])
            entry = next((e for e in entries if e["attempt"] == item.attempt), None)
            if (
                entry is not None
                and entry["status"] == "running"
                and _in(entry["ping_expire_time"]) > item.now
            ):
                # Neither applied nor rejected yet (the batch failed): write it alone.
                filter_, update = self._finish_op(item)

                async def write_one(f: dict[str, Any] = filter_, u: list[dict[str, Any]] = update) -> Any:
                    return await self.tasks.update_one(f, u)

                single = await self._call("finish", write_one)
                outcomes.append(bool(single.matched_count))
            else:
                outcomes.append(
                    entry is not None
                    and entry["status"] == item.outcome
                    and _in(entry["end_time"]) == item.now
                    and entry["worker_id"] == item.worker_id
                )
        return outcomes

    async def expire_leases(self, params: ExpireParams) -> int:
        now = _out(params.now)
        filter_ = {WS: {"$elemMatch": {"status": "running", "ping_expire_time": {"$lte": now}}}}
        match = {"$and": [{"$eq": ["$$e.status", "running"]}, {"$lte": ["$$e.ping_expire_time", _lit(now)]}]}
        changes = {
            "status": "lost",
            "end_time": params.now,
            "retry_at": params.now,
            "error": {"type": "LeaseExpired", "message": "the lease expired (no ping)", "traceback": None},
        }
        pipeline = [_rebuild_entries(match, changes), *_derive_stages(params.now)]

        async def expire() -> Any:
            return await self.tasks.update_many(filter_, pipeline)

        result = await self._call("expire leases", expire)
        return int(result.modified_count)

    # -- discovery ------------------------------------------------------------------------------

    async def find_wakeups(self, params: WakeupParams) -> list[Wakeup]:
        filter_ = {
            "name": {"$in": list(params.names)},
            "state.claim_at": {"$ne": None},
            "$or": [
                {"option.specific_worker_ids": {"$size": 0}},
                {"option.specific_worker_ids": params.worker_id},
            ],
        }

        async def read() -> list[dict[str, Any]]:
            cursor = (
                self.tasks.find(filter_, {"key": 1, "state.claim_at": 1})
                .sort("state.claim_at", 1)
                .limit(params.limit)
            )
            return [doc async for doc in cursor]

        docs = await self._call("find wake-ups", read)
        return [Wakeup(doc["key"], _in(doc["state"]["claim_at"]), "claim") for doc in docs]

    async def watch(
        self, names: Sequence[str], resume_token: Any = None
    ) -> AsyncGenerator[ChangeEvent, None]:
        """Change events from a change stream (``fullDocument: updateLookup``).

        Raises ``ChangeStreamUnsupported`` where the server or the fake cannot watch; the
        consumer then relies on polling alone. Resumable errors end the iterator with
        ``StorageError(transient=True)``; the consumer reopens with the last token.
        """
        pipeline = [
            {
                "$match": {
                    "operationType": {"$in": ["insert", "update", "replace"]},
                    "fullDocument.name": {"$in": list(names)},
                }
            },
            {
                "$project": {
                    "fullDocument.key": 1,
                    "fullDocument.name": 1,
                    "fullDocument.option": 1,
                    "fullDocument.state": 1,
                }
            },
        ]
        watch = getattr(self.tasks, "watch", None)
        if watch is None or not inspect.ismethod(watch):
            # mongomock's collections turn unknown attributes into sub-collections
            raise ChangeStreamUnsupported("this database object has no watch()")
        kwargs: dict[str, Any] = {"full_document": "updateLookup"}
        if resume_token is not None:
            kwargs["resume_after"] = resume_token
        try:
            stream = await _resolve(watch(pipeline, **kwargs))
        except NotImplementedError as exc:
            raise ChangeStreamUnsupported(str(exc) or "watch() is not implemented") from exc
        except OperationFailure as exc:
            if exc.code in CHANGE_STREAM_UNSUPPORTED_CODES or "replica set" in str(exc).lower():
                raise ChangeStreamUnsupported(str(exc)) from exc
            raise StorageError(f"watch failed: {exc}", transient=_is_transient(exc)) from exc
        except PyMongoError as exc:
            raise StorageError(f"watch failed: {exc}", transient=_is_transient(exc)) from exc
        try:
            async for change in stream:
                doc = change.get("fullDocument")
                if doc is None:
                    continue
                yield event_for(_in(doc), token=change.get("_id"))
        except PyMongoError as exc:
            raise StorageError(f"change stream broke: {exc}", transient=True) from exc
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                await _resolve(close())

    # -- reading and admin ----------------------------------------------------------------------

    async def get_task(self, key: str) -> dict[str, Any] | None:
        doc = await self._call("get task", lambda: self.tasks.find_one({"key": key}, {"_id": 0}))
        return _in(doc) if doc is not None else None

    async def list_tasks(self, params: ListParams) -> list[dict[str, Any]]:
        filter_: dict[str, Any] = {}
        if params.status is not None:
            filter_["state.status"] = params.status
        if params.name is not None:
            filter_["name"] = params.name

        async def read() -> list[dict[str, Any]]:
            cursor = (
                self.tasks.find(filter_, {"_id": 0})
                .sort([("state.create_time", 1), ("key", 1)])
                .skip(params.skip)
                .limit(params.limit)
            )
            return [_in(doc) async for doc in cursor]

        return await self._call("list tasks", read)

    async def count_by_status(self) -> dict[str, int]:
        async def read() -> dict[str, int]:
            cursor = await _resolve(
                self.tasks.aggregate([{"$group": {"_id": "$state.status", "n": {"$sum": 1}}}])
            )
            return {doc["_id"]: doc["n"] async for doc in cursor}

        return await self._call("count by status", read)

    async def update_option(self, params: UpdateOptionParams) -> bool:
        pipeline = [{"$set": {"option": _lit(params.option)}}, *_derive_stages(params.now)]

        async def update() -> Any:
            return await self.tasks.update_one({"key": params.key}, pipeline)

        result = await self._call("update option", update)
        return bool(result.matched_count)

    # -- workers ----------------------------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        doc = _out(
            {
                "host": info.host,
                "pid": info.pid,
                "names": list(info.names),
                "concurrency": info.concurrency,
                "start_time": info.start_time,
                "last_seen": info.start_time,
                "running_cnt": 0,
                "stop_requested": False,
                "stop_time": None,
            }
        )
        await self._call(
            "register worker",
            lambda: self.workers.update_one({"_id": info.worker_id}, {"$set": doc}, upsert=True),
        )

    async def heartbeat_worker(self, worker_id: str, now: datetime, running_cnt: int) -> bool:
        doc = await self._call(
            "worker heartbeat",
            lambda: self.workers.find_one_and_update(
                {"_id": worker_id},
                {"$set": {"last_seen": _out(now), "running_cnt": running_cnt}},
                projection={"stop_requested": 1},
                return_document=ReturnDocument.AFTER,
            ),
        )
        return bool(doc and doc.get("stop_requested"))

    async def request_worker_stop(self, worker_id: str, now: datetime) -> bool:
        result = await self._call(
            "request worker stop",
            lambda: self.workers.update_one(
                {"_id": worker_id, "stop_time": None},
                {"$set": {"stop_requested": True, "stop_request_time": _out(now)}},
            ),
        )
        return bool(result.matched_count)

    async def unregister_worker(self, worker_id: str, now: datetime) -> None:
        await self._call(
            "unregister worker",
            lambda: self.workers.update_one(
                {"_id": worker_id},
                {"$set": {"stop_time": _out(now), "last_seen": _out(now), "running_cnt": 0}},
            ),
        )

    async def list_workers(self) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            cursor = self.workers.find({}).sort("start_time", 1)
            return [_in({"worker_id": doc.pop("_id"), **doc}) async for doc in cursor]

        return await self._call("list workers", read)
