"""MongoDB driver: the ONLY module with collection names, filters, updates, indexes and streams.

It takes an async database object — PyMongo's ``AsyncDatabase``, or a Motor database — and
absorbs their API differences in one place (``aggregate``, ``watch`` and ``list_indexes`` are
coroutines in PyMongo's async API, plain calls in Motor's). It is written for MongoDB alone:
tests run it on a stand-in that answers as the server does (``mscheduler.testing``).

Query design:

* Every state change is one single-document update whose filter is the compare-and-set (fencing by
  ``worker_id`` + ``attempt`` + a running, unexpired entry), followed by the same pipeline stages
  that recompute the derived fields (``mscheduler.domain.state``), so derived state never drifts.
* The claim is one ``find_one_and_update`` served by the index ``claim`` (name, priority desc,
  targeted desc, claim_at asc); ``claim_at`` is null for tasks with no free slot or that are
  finished, so finished and full tasks are not in the scanned range.
* No ``$$NOW``: times come from the caller's server-corrected clock; a pipeline adds durations
  to them (a claim's lease, a lost lease's retry time). No ``arrayFilters``: entries change
  through ``$map`` or the positional ``$``.
* Literal values in pipelines are wrapped in ``$literal`` so that user data (results, errors)
  can never be read as field paths or operators.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from bson.errors import InvalidDocument
from bson.min_key import MinKey
from pymongo import ReadPreference, ReturnDocument, UpdateOne, WriteConcern
from pymongo.errors import (
    BulkWriteError,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
)
from pymongo.read_concern import ReadConcern

from mscheduler.domain.events import DEFAULT_RETENTION
from mscheduler.domain.exceptions import InvalidInput, StorageError
from mscheduler.domain.partitions import by_part, checked_partitions, part_of
from mscheduler.domain.state import claimer_tokens
from mscheduler.drivers.base import (
    DEFAULT_WORKER_RETENTION,
    ChangeEvent,
    ClaimedTask,
    ClaimParams,
    ClaimStep,
    DerivedByOption,
    Driver,
    ExpireParams,
    FinishParams,
    InsertParams,
    LaneParams,
    StreamPosition,
    Wakeup,
    WakeupParams,
    claim_over_parts,
    due_time,
    failure_times,
    new_entry,
    new_task_document,
    settlement,
)
from mscheduler.drivers.mongo.children import MongoChildren
from mscheduler.drivers.mongo.common import (
    AS_IS,
    ATTEMPT_INDEX,
    CLAIM_INDEX,
    CLAIM_SORT,
    CONFIG_CODES,
    DEADLINE_INDEX,
    DEFAULT_PARALLEL_CLAIMS,
    FINISHED,
    HISTORY_RUNNING,
    KEY_INDEX,
    LEASES_HISTORY_INDEX,
    LEASES_INDEX,
    MAJORITY_WTIMEOUT_MS,
    MAX_SCANS,
    META,
    SHARD_KEY,
    TASKS,
    UNIQUE_LIVE_INDEX,
    WAKEUP_INDEX,
    WORKER_STATES,
    WORKERS,
    T,
    WriteMayRollBack,
    by_keys,
    change_event,
    derive_stages,
    expired_entries_stage,
    expired_history_stage,
    from_mongo,
    from_mongo_in_place,
    is_transient,
    literal,
    live_hash,
    log,
    may_roll_back,
    one_task,
    rebuild_entries,
    reset_pipeline,
    resolved,
    storage_error,
    task_indexes,
    to_mongo,
    watch_error,
    watch_pipeline,
    write_concern_codes,
    write_concern_only,
)
from mscheduler.drivers.mongo.events import EVENT_INDEXES, MongoEvents
from mscheduler.drivers.mongo.indexes import IndexDef, ensure_indexes, index_problems
from mscheduler.drivers.mongo.limits import LIMIT_INDEXES, MongoLimits, limits_collection
from mscheduler.drivers.mongo.maintenance import MongoMaintenance
from mscheduler.drivers.mongo.ping import MongoPing
from mscheduler.drivers.mongo.plans import PLAN_INDEXES, MongoPlans, plans_collection
from mscheduler.drivers.mongo.queries import MongoTaskQueries
from mscheduler.drivers.mongo.stats import MongoStats
from mscheduler.drivers.mongo.workers import MongoWorkers, worker_indexes
from mscheduler.drivers.streams import Subscription, shared, wanted_by


def _layout_unread() -> StorageError:
    return StorageError(
        "the store's layout (its partitions) has not been read by this driver: every method of "
        "the Driver protocol reads it first; code reading MongoDriver.partitions directly awaits "
        "driver.known_layout() (or prepare()) before",
        config=True,
    )


@dataclass(slots=True, frozen=True)
class StoreLayout:
    """What ``mscheduler setup`` recorded of a store: its partitions, whether it is sharded
    (``recorded`` False: nothing, the store was never set up)."""

    partitions: int
    sharded: bool
    recorded: bool


# mongos releases routing a findAndModify by a shard-key prefix to one shard (SERVER-44422):
# every release from 7.1, and the patch releases of these that carry the backport
PREFIX_ROUTING_RELEASE = (7, 1)
PREFIX_ROUTING_BACKPORTS = frozenset({(5, 0), (6, 0), (7, 0)})
SHARD_KEY_NOT_FOUND = 61

D = TypeVar("D", bound="MongoDriver")
_READS_NO_LAYOUT = frozenset({"setup", "prepare", "server_time"})


def _layout_first(cls: type[D]) -> type[D]:
    """Every coroutine of the ``Driver`` protocol reads the store's layout (``known_layout``:
    its partitions, whether it is sharded) before it runs, once per driver object, whoever calls
    it — a consumer, a publisher, ``Operations`` under the CLI or the API, a service, a remote
    executor's server — so that no path can act as if the store had one partition because
    nothing prepared the driver. ``setup`` and ``prepare`` read it themselves; ``server_time``
    needs none. Reading ``partitions`` before it is known raises instead of guessing."""
    for name, member in vars(Driver).items():
        if name in _READS_NO_LAYOUT or not inspect.iscoroutinefunction(member):
            continue
        setattr(cls, name, _after_layout(getattr(cls, name)))
    return cls


def _after_layout(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(self: MongoDriver, *args: Any, **kwargs: Any) -> Any:
        if self._partitions is None:
            await self.known_layout()
        return await method(self, *args, **kwargs)

    return call


def _claimed_task(doc: dict[str, Any], attempt: str) -> ClaimedTask:
    """The claimed task, from the document the claim returned (ours alone: converted in place):
    only the parts it hands over are made aware, not the whole document (its derived state, the
    other entries)."""
    state = doc["state"]
    entries = state["worker_states"]
    position = next(i for i, e in enumerate(entries) if e["attempt"] == attempt)
    fail_cnt = state["fail_cnt"]
    option = from_mongo_in_place(doc["option"])
    params, parent, trace, needs = doc.get("params"), doc.get("parent"), doc.get("trace"), doc.get("needs")
    checkpoint = (state.get("checkpoint") or {}).get("data")
    retry_at = state.get("retry_at")
    # a value without a datetime inside (most are None or a string): no call
    return ClaimedTask(
        key=doc["key"],
        name=doc["name"],
        params=params if type(params) in AS_IS else from_mongo_in_place(params),
        option=option,
        attempt=attempt,
        attempt_no=position + 1,
        ping_expire_time=from_mongo(entries[position]["ping_expire_time"]),
        fail_cnt=fail_cnt,
        failure_times=failure_times(from_mongo_in_place(entries)) if fail_cnt else (),
        checkpoint=checkpoint if type(checkpoint) in AS_IS else from_mongo_in_place(checkpoint),
        parent=parent if type(parent) in AS_IS else from_mongo_in_place(parent),
        due_time=due_time({"option": option, "state": {"retry_at": retry_at and from_mongo(retry_at)}}),
        trace=trace if type(trace) in AS_IS else from_mongo_in_place(trace),
        needs=needs if type(needs) in AS_IS else from_mongo_in_place(needs),
        generation=int(state.get("generation") or 0),
        lane=option.get("fair_key"),
        claim_priority=int(state.get("claim_priority") or 0),
    )


@_layout_first
class MongoDriver(
    MongoEvents,
    MongoPing,
    MongoTaskQueries,
    MongoPlans,
    MongoWorkers,
    MongoMaintenance,
    MongoChildren,
    MongoStats,
    MongoLimits,
):
    """The task store on MongoDB.

    :param database: an async database (``AsyncMongoClient()[name]``; a Motor database works too;
        in tests, the in-memory stand-in of ``mscheduler.testing``).
    :param prefix: collection name prefix, to keep several independent schedulers in one database.
    :param retries: how many times a transient error is retried (with jittered exponential
        backoff) before it surfaces as ``StorageError(transient=True)``.
    :param events: keep an event log (``mscheduler.services.events``, collection ``mscheduler_events``),
        its documents deleted ``event_retention`` after their time (a TTL index).
    :param worker_retention: how long a stopped or silent worker's registration is kept (a TTL
        index on its ``last_seen``; no listing shows an older one).
    :param partitions: the store's number of partitions (``mscheduler.domain.partitions``; a
        sharded cluster's unit of placement, docs/scaling.md). Fixed when the store is set up
        (``setup()`` records it); None: as recorded (1 for a store set up without).
    :param sharded: set the store up for a sharded cluster (``setup()`` records it with the
        partitions; ``shard()`` shards the tasks collection). Read from the store otherwise.
    :param majority: tasks, workers, plans and limits are written with ``w: "majority"`` (and
        ``majority_timeout_ms``), so that a write survives a failover; False: the client's own
        write concern.
    :param create_indexes: ``prepare()`` (a consumer's or publisher's start) builds missing
        indexes itself, as ``setup()`` does (for a throwaway store, such as a test's). Otherwise
        they are built by ``mscheduler setup`` (``setup()``), and a start without them fails,
        naming them.
    :param max_parallel_claims: claims of one ``claim`` call in flight at once (its attempts are
        claimed concurrently; more at once would only pile onto the same head document).
    """

    def __init__(
        self,
        database: Any,
        *,
        prefix: str = "",
        retries: int = 5,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
        majority: bool = True,
        majority_timeout_ms: int = MAJORITY_WTIMEOUT_MS,
        events: bool = False,
        event_retention: timedelta = DEFAULT_RETENTION,
        max_parallel_claims: int = DEFAULT_PARALLEL_CLAIMS,
        worker_retention: timedelta = DEFAULT_WORKER_RETENTION,
        create_indexes: bool = False,
        partitions: int | None = None,
        sharded: bool = False,
    ) -> None:
        self.database = database
        tasks = database[f"{prefix}{TASKS}"]
        workers = database[f"{prefix}{WORKERS}"]
        if majority:
            # A timeout, so that a lagging secondary cannot block a consumer for ever: a
            # wtimeout is reported (the write is on the primary) and read back, not retried.
            concern = WriteConcern(w="majority", wtimeout=majority_timeout_ms)
            tasks = tasks.with_options(write_concern=concern)
            workers = workers.with_options(write_concern=concern)
        self.tasks = tasks
        self.workers = workers
        if not isinstance(worker_retention, timedelta) or worker_retention < timedelta(minutes=1):
            raise InvalidInput("worker_retention must be a timedelta of at least a minute")
        self.worker_retention = worker_retention
        self.plans = plans_collection(
            database, prefix, WriteConcern(w="majority", wtimeout=majority_timeout_ms) if majority else None
        )
        self.limits = limits_collection(
            database, prefix, WriteConcern(w="majority", wtimeout=majority_timeout_ms) if majority else None
        )
        self._init_read_views(tasks)
        # the store's layout (its partitions: fixed by setup, read by prepare)
        self.meta = database[f"{prefix}{META}"]
        self._asked_partitions = checked_partitions(partitions) if partitions is not None else None
        self._asked_sharded = sharded
        # the store's layout once read (``known_layout``: every method of the Driver protocol
        # reads it before its first call, see ``_layout_first``); None until then
        self._partitions: int | None = None
        self._sharded = sharded
        self._layout_recorded = False
        majority_concern = WriteConcern(w="majority", wtimeout=majority_timeout_ms) if majority else None
        self._init_events(database, prefix, majority_concern, events, event_retention)
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.commands = 0  # storage commands sent (benchmarks count them)
        self.claims_empty = 0  # claims that found nothing (a lost race, or no task due)
        self.max_parallel_claims = max_parallel_claims
        # the parts of the claims of the latest ``claim`` call (``_claim_shared``)
        self._claim_memo: (
            tuple[ClaimParams, tuple[int, str | None], tuple[dict[str, Any], dict[str, Any], list[Any]]]
            | None
        ) = None
        self._set_up = False
        self.rebuilt: list[str] = []  # indexes the last setup() rebuilt or dropped (spec changes)
        self.create_indexes = create_indexes

    def _init_read_views(self, tasks: Any) -> None:
        """The views reads that decide go through. Scheduler read-backs (claim recovery, ping and
        finish outcomes) go to the primary whatever the client's read preference. The claim
        recovery looks at local read concern first (a claim whose majority write timed out, 64,
        is applied on the primary but not majority-committed: a majority read alone misses it),
        then waits for a majority to have it (``_recover_claim``); a publish whose majority write
        timed out is confirmed at majority too before it is reported created. Limit reads that
        decide (which limit holds a slot, an acquire's recovery) and the planner's (which plans
        are due, a lost compare-and-set's recovery) read the primary as well."""
        primary = ReadPreference.PRIMARY
        self.tasks_primary = tasks.with_options(read_preference=primary)
        self.tasks_recovery = tasks.with_options(read_preference=primary, read_concern=ReadConcern("local"))
        self.tasks_majority = tasks.with_options(
            read_preference=primary, read_concern=ReadConcern("majority")
        )
        self.limits_primary = self.limits.with_options(read_preference=primary)
        self.plans_primary = self.plans.with_options(read_preference=primary)

    @property
    def partitions(self) -> int:
        """The store's number of partitions, as recorded by ``setup`` (``known_layout``)."""
        if self._partitions is None:
            raise _layout_unread()
        return self._partitions

    @property
    def sharded(self) -> bool:
        """Whether the store is set up for a sharded cluster (read with the partitions)."""
        if self._partitions is None:
            raise _layout_unread()
        return self._sharded

    async def known_layout(self) -> StoreLayout:
        """The store's layout, read from the store on the first call (a store never set up: as
        asked, else 1 partition, not sharded, ``recorded`` False; nothing is written)."""
        if self._partitions is None:
            await self._layout(record=False)
        return StoreLayout(self.partitions, self._sharded, self._layout_recorded)

    def _part(self, key: str) -> int:
        """The partition of task ``key`` (every write about one task names it)."""
        return part_of(key, self.partitions)

    # -- plumbing ---------------------------------------------------------------------------------

    async def _call(
        self,
        what: str,
        operation: Callable[[], Awaitable[T]],
        *,
        recover: Callable[[], Awaitable[T | None]] | None = None,
        session: Any = None,
        retries: int | None = None,
    ) -> T:
        """Run one command, retrying transient errors with backoff (``retries``: how many times,
        by default the driver's); translate the rest.

        ``recover`` is asked after an error whose outcome is unknown (the write may have been
        applied before the reply was lost, or applied on the primary while the majority write
        concern timed out), the last try's included; if it finds the effect, that is the answer.

        Inside the caller's transaction (``session``) nothing is retried here and PyMongo's
        errors are re-raised as they are, labels (``TransientTransactionError``) intact, so that
        the caller's ``with_transaction`` can retry the whole transaction.
        """
        if session is not None:
            self.commands += 1
            try:
                return await operation()
            except InvalidDocument as exc:
                raise storage_error(what, exc) from exc
        delay = self.backoff
        tries = (self.retries if retries is None else retries) + 1
        for attempt in range(tries):
            try:
                self.commands += 1
                return await operation()
            except DuplicateKeyError:
                raise
            except (PyMongoError, InvalidDocument) as exc:
                error = storage_error(what, exc)
                if write_concern_only(exc) and not error.config and not error.transient:
                    # wtimeout and the like (alone, or as a bulk write's only errors: 65): applied
                    # on the primary, not yet on a majority. Not retried (it would wait again);
                    # the caller learns the outcome by reading.
                    log.warning("%s: write concern not satisfied yet (%s)", what, exc)
                    if recover is not None:
                        found = await self._call(f"{what} (recovery read)", recover)
                        if found is not None:
                            return found
                    raise StorageError(f"{what}: outcome unknown: {exc}", transient=True) from exc
                if not error.transient:
                    if error.config:
                        log.error("%s: configuration error: %s", what, exc)
                    raise error from exc
                if attempt == tries - 1 and recover is None:
                    raise StorageError(f"{what} failed after {tries} tries: {exc}", transient=True) from exc
                log.warning("%s: transient error (%s), looking again in %.2fs", what, exc, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_backoff)
                if recover is not None:
                    found = await self._call(f"{what} (recovery read)", recover)
                    if found is not None:
                        return found
                    if attempt == tries - 1:
                        raise StorageError(
                            f"{what} failed after {tries} tries (not applied, as far as a read "
                            f"can tell): {exc}",
                            transient=True,
                        ) from exc
        raise AssertionError("unreachable")

    async def setup(self) -> None:
        """Record the store's layout (its partitions) and create the indexes (idempotent; an
        index whose spec changed is rebuilt, ``drivers/mongo/indexes.py``)."""
        await self._layout(record=True)
        indexes = task_indexes(self.sharded)
        self.rebuilt = await self._call("create indexes", lambda: ensure_indexes(self.tasks, indexes))
        await self._call("create plan indexes", self._create_plan_indexes)
        await self._call("create limit indexes", self._create_limit_indexes)
        await self._call("create worker indexes", self._create_worker_indexes)
        await self._create_event_indexes()
        self._set_up = True

    async def prepare(self) -> None:
        """Before a consumer's, publisher's or server's first operation: read the store's layout
        and check the indexes every query names (``hint``). Building them is
        ``setup()``'s (``mscheduler setup``): ``createIndexes`` waits for the commit quorum of
        a replica set, and a consumer's start should not (nor should every consumer of a fleet
        try). A store without them raises a configuration ``StorageError`` that names them.
        With ``create_indexes`` (a throwaway store, such as a test's) this is ``setup()``."""
        if self.create_indexes:
            if not self._set_up:
                await self.setup()
            await self._check_claim_routing()
            return
        await self._layout(record=False)
        await self._check_claim_routing()
        missing = await self.missing_indexes()
        if missing:
            where = f"{self.database.name}.{self.tasks.name}"
            raise StorageError(
                f"the store {where} is not set up: {', '.join(missing)}; run `mscheduler setup "
                "--mongodb-uri ...` (or `await MongoDriver(...).setup()`) once, before starting workers",
                config=True,
            )

    async def _check_claim_routing(self) -> None:
        """On a sharded store: can the mongos route a claim to its partition's one shard? A claim
        is the one write that cannot name its task (its ``_id``), only its partition, a prefix of
        the shard key; a mongos routes such a ``findAndModify`` from 7.1 on, and in the 5.0, 6.0
        and 7.0 patch releases that carry SERVER-44422 (from the second half of 2023), which
        this asks the mongos itself (an explain of a claim); earlier ones refuse every claim
        ("Query for sharded findAndModify must contain the shard key"). A configuration
        ``StorageError`` names the releases to upgrade to."""
        if not self.sharded:
            return
        version = str((await self.server_info()).get("version") or "")
        numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
        if numbers >= PREFIX_ROUTING_RELEASE:
            return
        if numbers in PREFIX_ROUTING_BACKPORTS:
            probe = {"part": 0, "state.claimers": "-"}  # a claim's shape: the partition only
            command = {"findAndModify": self.tasks.name, "query": probe, "update": {"$set": {"x": 1}}}
            try:
                await self.database.command({"explain": command, "verbosity": "queryPlanner"})
                return
            except OperationFailure as exc:
                if exc.code != SHARD_KEY_NOT_FOUND:
                    raise storage_error("check claim routing", exc) from exc
        raise StorageError(
            f"the mongos ({version or 'version unknown'}) cannot route a claim (a findAndModify "
            "naming a task's partition, a prefix of the shard key) to one shard: upgrade the "
            "cluster to a 5.0, 6.0 or 7.0 patch release from the second half of 2023 on "
            "(SERVER-44422), or to 7.1 or later",
            config=True,
        )

    async def _layout(self, *, record: bool) -> None:
        """Read the store's layout (``<prefix>mscheduler_meta``, ``_id: "layout"``): its number of
        partitions, fixed when it was set up, and whether it is sharded. ``record``: write it
        when there is none (``setup``). A driver asking for another number is refused."""

        async def read() -> dict[str, Any] | None:
            doc: dict[str, Any] | None = await self.meta.find_one({"_id": "layout"})
            return doc

        layout = await self._call("read the store's layout", read)
        if layout is None:
            partitions, sharded = self._asked_partitions or 1, self._asked_sharded
            if record:
                stored = {"_id": "layout", "partitions": partitions, "sharded": sharded}
                await self._call(
                    "record the store's layout",
                    lambda: self.meta.replace_one({"_id": "layout"}, stored, upsert=True),
                )
            self._partitions, self._sharded, self._layout_recorded = partitions, sharded, record
            return
        partitions = int(layout.get("partitions") or 1)
        if self._asked_partitions is not None and self._asked_partitions != partitions:
            raise StorageError(
                f"the store was set up with {partitions} partitions, not {self._asked_partitions}: "
                "partitions are fixed (docs/scaling.md, growing P)",
                config=True,
            )
        self._partitions = partitions
        self._sharded = self._asked_sharded or bool(layout.get("sharded"))
        self._layout_recorded = True
        if record and self._sharded and not layout.get("sharded"):
            await self._call(
                "record the store's layout",
                lambda: self.meta.update_one({"_id": "layout"}, {"$set": {"sharded": True}}),
            )

    async def shard(self, *, zones: bool = True) -> list[dict[str, Any]]:
        """Shard the tasks collection of a store set up with ``sharded=True`` (an administrator's
        step, on a mongos: ``mscheduler setup --shards``): shard key ``{part: 1, _id: 1}``, a
        chunk boundary at each partition, and (``zones``) the partitions spread over the shards
        in contiguous ranges, one zone per shard, so that each partition lives on one shard and a
        claim naming it reaches that shard (a findAndModify with a shard-key prefix that targets
        one shard: SERVER-44422). Returns the commands sent. The other collections (plans,
        limits, workers, events, the layout) stay unsharded, on the database's primary shard.

        Run again after shards were added or removed, it moves the zones: the ranges of the
        earlier spread that the new one does not keep are removed first (a new range may not
        overlap an old one), then the new ones are added, then shards are taken out of the
        zones they no longer hold; the balancer moves the partitions' chunks."""
        if not self.sharded:
            raise InvalidInput("shard() needs a store set up with MongoDriver(..., sharded=True)")
        admin = self.database.client.admin
        namespace = f"{self.database.name}.{self.tasks.name}"
        sent: list[dict[str, Any]] = []

        async def run(command: dict[str, Any]) -> Any:
            sent.append(command)
            return await admin.command(command)

        await run({"shardCollection": namespace, "key": dict(SHARD_KEY)})
        for part in range(1, self.partitions):  # a chunk boundary at each partition
            try:
                await run({"split": namespace, "middle": {"part": part, "_id": MinKey()}})
            except OperationFailure as exc:
                log.info("split at partition %d: %s (a boundary already there?)", part, exc)
        if zones:
            await self._spread_zones(admin, namespace, run)
        return sent

    async def _spread_zones(
        self, admin: Any, namespace: str, run: Callable[[dict[str, Any]], Awaitable[Any]]
    ) -> None:
        """The partitions over the shards in contiguous ranges, one zone per shard (``shard``)."""
        listed = (await admin.command({"listShards": 1}))["shards"]
        shards = [s["_id"] for s in listed]
        wanted: dict[str, tuple[str, int, int]] = {}  # zone -> (shard, low, high)
        for i, shard in enumerate(shards):
            low = i * self.partitions // len(shards)
            high = (i + 1) * self.partitions // len(shards)
            if low < high:  # (more shards than partitions: this one holds none)
                wanted[f"{self.tasks.name}-{low}-{high - 1}"] = (shard, low, high)
        ours = f"{self.tasks.name}-"
        existing = [doc async for doc in self.database.client["config"]["tags"].find({"ns": namespace})]
        kept: set[str] = set()
        for doc in existing:
            zone, low, high = doc.get("tag"), doc["min"].get("part"), doc["max"].get("part")
            if zone in wanted and wanted[zone][1:] == (low, high):
                kept.add(zone)
            elif str(zone).startswith(ours):
                await run(
                    {"updateZoneKeyRange": namespace, "min": doc["min"], "max": doc["max"], "zone": None}
                )
        for zone, (shard, low, high) in wanted.items():
            await run({"addShardToZone": shard, "zone": zone})
            if zone not in kept:
                bounds = {"min": {"part": low, "_id": MinKey()}, "max": {"part": high, "_id": MinKey()}}
                await run({"updateZoneKeyRange": namespace, **bounds, "zone": zone})
        for shard in listed:
            for zone in shard.get("tags") or ():
                if str(zone).startswith(ours) and wanted.get(zone, ("",))[0] != shard["_id"]:
                    await run({"removeShardFromZone": shard["_id"], "zone": zone})

    async def missing_indexes(self) -> list[str]:
        """The indexes this build's queries need that the store lacks or has with another spec
        (``collection: index (why)``); empty when the store is set up."""

        async def check() -> list[str]:
            wanted: list[tuple[Any, list[IndexDef]]] = [
                (self.tasks, task_indexes(self.sharded)),
                (self.plans, PLAN_INDEXES),
                (self.limits, LIMIT_INDEXES),
                (self.workers, worker_indexes(self.worker_retention)),
            ]
            if self.record_events:
                wanted.append((self.events, EVENT_INDEXES))
            return [f"{c.name}: {p}" for c, indexes in wanted for p in await index_problems(c, indexes)]

        return await self._call("check indexes", check)

    @property
    def namespace(self) -> str:
        """``database.collection`` of the tasks, for reports."""
        return f"{self.tasks.database.name}.{self.tasks.name}"

    async def drop(self) -> None:
        """Drop this scheduler's collections (the demo cleans up with it)."""
        await self._call("drop tasks", self.tasks.drop)
        await self._call("drop workers", self.workers.drop)
        await self._call("drop plans", self.plans.drop)
        await self._call("drop limits", self.limits.drop)
        await self._call("drop events", self.events.drop)
        await self._call("drop layout", self.meta.drop)

    async def index_names(self) -> list[str]:
        cursor = await resolved(self.tasks.list_indexes())
        return [ix["name"] async for ix in cursor]

    async def server_time(self) -> datetime | None:
        async def hello() -> datetime | None:
            try:
                reply = await self.database.command("hello")
            except OperationFailure:
                return None
            local = reply.get("localTime")
            return from_mongo(local) if isinstance(local, datetime) else None

        try:
            return await self._call("hello", hello)
        except StorageError:
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

    async def _insert_tasks_only(self, params: InsertParams) -> list[int | None]:
        """``insert_tasks`` without events (``MongoEvents.insert_tasks`` records them): for each
        task, the generation it was created (0) or reset in, or None when nothing was written."""
        if self.sharded and any(task.unique_hash is not None for task in params.tasks):
            raise InvalidInput(
                "unique_by='params' is not available on a sharded store (a unique index must be "
                "prefixed by the shard key): make the key from the params instead "
                "(mscheduler.domain.unique.params_hash), which the key's uniqueness enforces"
            )
        created: list[int | None] = [None] * len(params.tasks)
        pending = list(range(len(params.tasks)))
        if params.reset_finished:
            reset = await self._reset_finished(params)
            pending = [i for i in pending if params.tasks[i].key not in reset]
            for i, task in enumerate(params.tasks):
                created[i] = reset.get(task.key)
        if not pending:
            return created
        # ``_id`` is the key: change events (which carry only the documentKey of an update)
        # then say which task changed without a lookup.
        # Its aware datetimes as they are: PyMongo encodes an aware time as the UTC milliseconds
        # BSON stores, the same bytes as the naive UTC time (no walk of every document here).
        derived: DerivedByOption = {}
        docs = [
            {"_id": params.tasks[i].key}
            | new_task_document(params.tasks[i], params.now, self.partitions, derived)
            for i in pending
        ]
        if params.session is not None:
            # an update's document, naive UTC as every filter and update the driver sends
            inserted = await self._upsert_in_transaction([to_mongo(doc) for doc in docs], params.session)
        else:
            inserted = await self._insert(docs)
        for position, i in enumerate(pending):
            created[i] = 0 if position in inserted else None
        return created

    async def _insert(self, docs: list[dict[str, Any]]) -> set[int]:
        """insert_many per partition (a sharded cluster's one shard each: one command when the
        store is unpartitioned); duplicate keys are the existing tasks. Returns the positions
        inserted."""
        if self.partitions == 1:
            return await self._insert_part(docs)
        inserted: set[int] = set()
        positions: dict[int, list[int]] = {}
        for i, doc in enumerate(docs):
            positions.setdefault(doc["part"], []).append(i)
        for part_positions in positions.values():
            done = await self._insert_part([docs[i] for i in part_positions])
            inserted |= {part_positions[j] for j in done}
        return inserted

    async def _insert_part(self, docs: list[dict[str, Any]]) -> set[int]:
        """One ``insert_many``: the positions it created. A duplicate key is a task that exists.
        An insert the primary applied and could not confirm is made sure of first, since a task
        reported created must not be lost:

        * the primary stepped down or shut down (``may_roll_back``): the write may be rolled
          back, so it is sent again (``_call``'s retry); a duplicate key then is an earlier try's
          insert that survived, still created by this call;
        * any other write-concern error (64, a majority not reached in time): applied on the
          primary, read back at majority read concern (``_confirmed``) until a majority has it;
          what no majority confirms raises a transient ``StorageError`` (send again: by key,
          nothing is created twice)."""
        earlier: set[int] = set()  # inserted by a try whose primary then stepped down
        unconfirmed: set[int] = set()

        async def insert() -> set[int]:
            # Handled here, inside the operation: BulkWriteError is a PyMongoError, so ``_call``
            # would otherwise turn it into a StorageError.
            try:
                await self.tasks.insert_many(docs, ordered=False)
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors", [])
                if any(err.get("code") != 11000 for err in errors):
                    raise
                existing = {err["index"] for err in errors}
                applied = set(range(len(docs))) - existing
                if exc.details.get("writeConcernErrors"):
                    if write_concern_codes(exc) & CONFIG_CODES:
                        raise
                    if may_roll_back(exc):
                        earlier.update(applied)
                        raise WriteMayRollBack(f"insert tasks: {exc.details['writeConcernErrors']}") from exc
                    log.warning("insert tasks: write concern not satisfied yet: %s", exc.details)
                    unconfirmed.update(applied)
                return applied | (earlier & existing)
            return set(range(len(docs)))

        created = await self._call("insert tasks", insert)
        if unconfirmed:
            missing = unconfirmed - await self._confirmed(docs, unconfirmed)
            if missing:
                raise StorageError(
                    f"insert tasks: {len(missing)} tasks applied on the primary, not confirmed by "
                    "a majority: outcome unknown, send them again",
                    transient=True,
                )
        return created

    async def _confirmed(self, docs: list[dict[str, Any]], positions: set[int]) -> set[int]:
        """Which of ``positions`` (documents the primary took, all of one partition) a majority
        has: read at majority read concern, again with backoff while some are missing."""
        keys = {docs[i]["_id"]: i for i in positions}
        part = docs[next(iter(positions))]["part"]
        found: set[int] = set()
        delay = self.backoff
        for attempt in range(self.retries + 1):
            wanted = [k for k, i in keys.items() if i not in found]

            async def read(wanted: list[str] = wanted) -> list[str]:
                filter_ = {"_id": {"$in": wanted}, "part": part}
                return [doc["_id"] async for doc in self.tasks_majority.find(filter_, {"_id": 1})]

            found |= {keys[k] for k in await self._call("insert tasks (majority read)", read)}
            if len(found) == len(keys) or attempt == self.retries:
                break
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, self.max_backoff)
        return found

    async def _upsert_in_transaction(self, docs: list[dict[str, Any]], session: Any) -> set[int]:
        """Inside the caller's transaction: an existing key must not abort it, as a duplicate key
        error would. An upsert with ``$setOnInsert`` creates the task or leaves it; nothing is
        retried here and PyMongo's errors keep their labels (see ``_call``)."""
        # A task unique by params is not inserted while a live task holds its hash either. The
        # $type is what lets the $or's second branch use the partial index unique_live (an
        # equality alone cannot be proven inside a {$type: "string"} partial filter: the branch
        # would scan the collection, per task, inside the caller's transaction).
        ops = [
            UpdateOne(
                {"$or": [{"key": doc["key"]}, {"state.unique_live": live_hash(doc["unique_hash"])}]},
                {"$setOnInsert": doc},
                upsert=True,
            )
            if doc.get("unique_hash")
            # The whole shard key, as an upsert on a sharded collection needs: the inserted
            # document takes _id and part from the filter's equalities (not from $setOnInsert,
            # which may not set the _id a filter names).
            else UpdateOne(
                one_task(doc["_id"], doc["part"]),
                {"$setOnInsert": {k: v for k, v in doc.items() if k not in ("_id", "part")}},
                upsert=True,
            )
            for doc in docs
        ]

        async def upsert() -> Any:
            return await self.tasks.bulk_write(ops, ordered=True, session=session)

        result = await self._call("insert tasks (transaction)", upsert, session=session)
        return set(result.upserted_ids)

    async def _reset_finished(self, params: InsertParams) -> dict[str, int]:
        """Reset the tasks that ended (succeeded or failed) to pending with their new params and
        options, in a new generation: one bulk write for the batch, then one read of which ones
        it reset (key -> generation)."""
        mark = uuid.uuid4().hex
        ops = []
        taken = await self._taken_hashes(params) if params.session is not None else set()
        for task in params.tasks:
            if task.unique_hash is not None and task.unique_hash in taken:
                continue  # a live task holds its params: not reset (reported not created)
            doc = new_task_document(task, params.now, self.partitions)
            state = dict(doc["state"])
            state.pop("create_time")
            state["reset_mark"] = mark
            update = reset_pipeline(doc, state, params.now, params.by)
            # never while an attempt holds a live lease (a succeeded task may still run one whose
            # slot an edit of concurrent_worker_cnt took away): dropping it would let the reset
            # task be claimed beside it
            live = {"status": "running", "ping_expire_time": {"$gt": to_mongo(params.now)}}
            filter_ = {
                **one_task(task.key, self._part(task.key)),
                "state.status": {"$in": list(FINISHED)},
                "$nor": [{WORKER_STATES: {"$elemMatch": live}}],
            }
            ops.append(UpdateOne(filter_, update))
        if not ops:
            return {}

        written, rolled, unconfirmed = await self._write_resets(ops, params)
        if not written and not rolled:
            return {}
        keys = [task.key for task in params.tasks]
        source = self.tasks_majority if unconfirmed else self.tasks_primary

        async def read() -> dict[str, int]:
            cursor = source.find(
                {**by_keys(keys, self.partitions), "state.reset_mark": mark},
                {"key": 1, "state.generation": 1},
                session=params.session,
            )
            return {doc["key"]: int(doc["state"].get("generation") or 0) async for doc in cursor}

        reset = await self._call("reset tasks (read back)", read, session=params.session)
        if unconfirmed and len(reset) < written:
            raise StorageError(
                "reset tasks: applied on the primary, not confirmed by a majority: outcome "
                "unknown, send them again",
                transient=True,
            )

        for part, keys_of_part in by_part(sorted(reset), self.partitions).items():

            async def unmark(part: int = part, keys_of_part: list[str] = keys_of_part) -> Any:
                return await self.tasks.update_many(
                    {"key": {"$in": keys_of_part}, "part": part, "state.reset_mark": mark},
                    {"$unset": {"state.reset_mark": ""}},
                    session=params.session,
                )

            await self._call("reset tasks (unmark)", unmark, session=params.session)
        return reset

    async def _write_resets(self, ops: list[UpdateOne], params: InsertParams) -> tuple[int, bool, bool]:
        """The resets' bulk write: (how many it changed, whether a try met a primary that stepped
        down, whether a majority did not confirm it in time). A stepped-down primary's writes may
        roll back: written again (those that stayed no longer match; the read-back finds them by
        their mark either way); a majority not reached in time: the caller reads back at
        majority read concern before it reports them reset."""
        rolled: list[bool] = []
        unconfirmed: list[bool] = []

        async def write() -> int:
            try:
                result = await self.tasks.bulk_write(ops, ordered=False, session=params.session)
            except BulkWriteError as exc:
                # a reset whose params hash a live task holds is refused by the unique index
                # ``unique_live``: that task stays as it is (reported not created)
                if params.session is not None or any(
                    e.get("code") != 11000 for e in exc.details.get("writeErrors", [])
                ):
                    raise
                if exc.details.get("writeConcernErrors"):
                    if write_concern_codes(exc) & CONFIG_CODES:
                        raise
                    if may_roll_back(exc):
                        rolled.append(True)
                        raise WriteMayRollBack(f"reset tasks: {exc.details['writeConcernErrors']}") from exc
                    unconfirmed.append(True)
                return int(exc.details.get("nModified", 0))
            return int(result.modified_count)

        written = await self._call("reset tasks", write, session=params.session)
        return written, bool(rolled), bool(unconfirmed)

    async def _taken_hashes(self, params: InsertParams) -> set[str]:
        """Inside the caller's transaction, the params hashes of ``params.tasks`` that would make a
        reset fail: held by a live task, or by an earlier task of the batch. Read first, in the
        session, because a duplicate key error in a transaction aborts it (the caller's writes
        with it); the session's snapshot covers the reset that follows, and a task that takes a
        hash meanwhile conflicts with it (a write conflict: the caller's with_transaction
        retries)."""
        hashes = [t.unique_hash for t in params.tasks if t.unique_hash is not None]
        if not hashes:
            return set()

        async def read() -> set[str]:
            # $type: the partial index unique_live holds strings only; a query must say so for
            # the planner to use it (an equality alone does not prove the subset)
            filter_ = {"state.unique_live": {"$in": hashes, "$type": "string"}}
            cursor = self.tasks_primary.find(filter_, {"state.unique_live": 1}, session=params.session)
            return {doc["state"]["unique_live"] async for doc in cursor.hint(UNIQUE_LIVE_INDEX)}

        taken = await self._call("reset tasks (params taken)", read, session=params.session)
        seen: set[str] = set()
        for h in hashes:  # a batch that resets two tasks of equal params: the first one only
            if h in seen:
                taken.add(h)
            seen.add(h)
        return taken

    # -- claim / ping / finish --------------------------------------------------------------------

    def _claim_filter(
        self, params: ClaimParams, tokens: Sequence[str] | None = None, part: int = 0
    ) -> dict[str, Any]:
        now = to_mongo(params.now)
        if tokens is None:
            tokens = claimer_tokens(list(params.names), params.worker_id, params.groups)
        # ``state.claimers`` holds this worker's token (targeted at it) or the name's "anyone"
        # token: an equality on the claim index's prefix. A non-empty claimers implies a free
        # slot, an unfinished task, an unused budget and (targeted) an allowed worker with no
        # running or succeeded entry; the residual $nor is for untargeted fan-out tasks.
        filter_: dict[str, Any] = {
            "part": part,  # one partition: a sharded cluster's one shard
            "state.claimers": {"$in": list(tokens)},
            # the order's time bounds the range (order_at <= claim_at); claim_at, after it in the
            # index, is checked on the keys (a task that ages may be in the range before it is due)
            "state.order_at": {"$lte": now},
            "state.claim_at": {"$lte": now},
            # not started after its deadline (the deadline pass marks such tasks expired)
            "$or": [{"option.deadline": None}, {"option.deadline": {"$gt": now}}],
            # not running it already, and (unless it may repeat) not succeeded on it:
            # residual for "anyone" and group tokens, which do not list who ran the task
            "$nor": [
                {WORKER_STATES: {"$elemMatch": {"worker_id": params.worker_id, "status": "running"}}},
                {
                    "option.same_worker_may_repeat": {"$ne": True},
                    WORKER_STATES: {"$elemMatch": {"worker_id": params.worker_id, "status": "succeeded"}},
                },
            ],
        }
        if params.exclude_keys:
            filter_["key"] = {"$nin": list(params.exclude_keys)}
        return filter_

    def _claim_entry(self, params: ClaimParams, attempt: str) -> dict[str, Any]:
        """The new worker entry as a pipeline expression: its lease ends at ``now`` plus the
        task's own stored ``worker_timeout_ms`` (capped by ``max_lease``), computed by the server
        inside the claim."""
        entry: dict[str, Any] = to_mongo(new_entry(params, attempt, params.now))
        # An object inside an array is an expression too; its strings are ids and constants
        # (validated not to start with '$'), so it is written as is.
        if any(isinstance(v, str) and v.startswith("$") for v in entry.values()):
            raise StorageError(f"refusing a worker entry with '$'-prefixed values: {entry}")
        lease: Any = "$option.worker_timeout_ms"
        if params.max_lease is not None:
            lease = {"$min": [lease, int(params.max_lease / timedelta(milliseconds=1))]}
        entry["ping_expire_time"] = {"$add": [entry["ping_expire_time"], lease]}
        return entry

    def _claim_shared(
        self, params: ClaimParams, part: int, lane: str | None
    ) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
        """What the claims of one ``claim`` call in partition ``part`` and lane ``lane`` share:
        the filter (the lane's claimer tokens), the new entry but its attempt token, the stages
        after the append. Built by the first of them, not once per attempt (neither PyMongo nor
        a claim changes them)."""
        memo = self._claim_memo
        if memo is not None and memo[0] is params and memo[1] == (part, lane):
            return memo[2]
        tokens = claimer_tokens(list(params.names), params.worker_id, params.groups, (lane,))
        shared = (
            self._claim_filter(params, tokens, part=part),
            self._claim_entry(params, ""),
            [*self._trim_stages(params), *derive_stages(params.now, raw=True)],
        )
        self._claim_memo = (params, (part, lane), shared)
        return shared

    async def _claim_one(
        self,
        params: ClaimParams,
        attempt: str,
        key: str | None = None,
        part: int = 0,
        lane: str | None = None,
    ) -> ClaimedTask | None:
        """One claim in one lane: the first task in the claim order (or the task ``key``, a head
        the chunked claim chose: see ``_claim_chunked``)."""
        filter_, template, stages = self._claim_shared(params, part, lane)
        if attempt.startswith("$"):
            raise StorageError(f"refusing a worker entry with a '$'-prefixed attempt: {attempt}")
        entry = template | {"attempt": attempt}  # in the template's place: the same document
        append = {"$set": {WORKER_STATES: {"$concatArrays": [f"${WORKER_STATES}", [entry]]}}}
        pipeline = [append, *stages]
        sort = CLAIM_SORT

        async def claim() -> dict[str, Any] | None:
            if key is not None:
                pinned: dict[str, Any] | None = await self.tasks.find_one_and_update(
                    {"$and": [filter_, {"key": key, "_id": key}]},
                    pipeline,
                    return_document=ReturnDocument.AFTER,
                    hint=KEY_INDEX,
                )
                return pinned
            doc: dict[str, Any] | None = await self.tasks.find_one_and_update(
                filter_, pipeline, sort=sort, return_document=ReturnDocument.AFTER, hint=CLAIM_INDEX
            )
            return doc

        async def recover() -> dict[str, Any] | None:
            return await self._recover_claim(params, attempt, part)

        try:
            # Not sent again after an error (the claimer claims again, with new tokens): a claim
            # still in flight that the recovery read missed could land after a second one with
            # the same token, and that second task would sit unused until its lease ran out.
            doc = await self._call("claim", claim, recover=recover, retries=0)
        except StorageError as exc:
            if not exc.document:
                raise
            # One task cannot take another entry (too large): left as it is, it would fail
            # every claim of every consumer. Find it, mark it failed with the reason, carry on.
            doc = await self._claim_head_or_mark_it(filter_, sort, pipeline, recover, exc, params.now)
        if doc is None:
            return None
        return _claimed_task(doc, attempt)

    async def _recover_claim(self, params: ClaimParams, attempt: str, part: int) -> dict[str, Any] | None:
        """After a claim's error of unknown outcome (its reply lost, or the majority write timed
        out): the task our attempt token is stored on, if the claim was applied and a majority
        has it. Found on the primary (local read concern: a claim not majority-committed yet is
        there) but not confirmed by a majority read, even after a few (a primary that may roll
        it back, another worker claiming the task meanwhile): the attempt is released at once
        (not counted) and the claim is given up."""
        found = {f"{WORKER_STATES}.attempt": attempt, "part": part}  # the claim's one partition (shard)
        docs = [d async for d in self.tasks_recovery.find(found).hint(ATTEMPT_INDEX).limit(1)]
        if not docs:
            return None
        doc: dict[str, Any] = docs[0]
        delay = self.backoff
        for _ in range(self.retries + 1):
            if await self.tasks_majority.find_one(found, {"_id": 1}) is not None:
                return doc
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, self.max_backoff)
        log.warning("claim of %s: not confirmed by a majority; releasing it", doc["key"])
        error = {"type": "ClaimUnconfirmed", "message": "no majority confirmed the claim", "traceback": None}
        release = FinishParams(doc["key"], params.worker_id, attempt, params.now, "released", None, error)
        filter_, update = self._finish_op(release)
        try:
            await self._call(
                "claim (release the unconfirmed)", lambda: self.tasks.update_one(filter_, update)
            )
        except StorageError as exc:
            log.warning(
                "could not release the unconfirmed claim of %s (%s): its lease runs out", doc["key"], exc
            )
        return None

    async def _claim_head_or_mark_it(
        self,
        filter_: dict[str, Any],
        sort: Any,
        pipeline: list[dict[str, Any]],
        recover: Callable[[], Awaitable[dict[str, Any] | None]],
        exc: StorageError,
        now: datetime,
    ) -> dict[str, Any] | None:
        """After a claim failed as too large: which task failed is not in the error, and what
        heads the claim order now may be another (a higher priority that arrived meanwhile, the
        failing one claimed by nobody). So the claim is tried again on the head's key alone: a
        task that fails that way too is the one that cannot take another entry, and is marked
        broken; a healthy head is claimed (returned); a head taken meanwhile gives None."""

        async def find() -> dict[str, Any] | None:
            cursor = self.tasks_primary.find(filter_, {"key": 1}).sort(sort).limit(1).hint(CLAIM_INDEX)
            docs = [doc async for doc in cursor]
            return docs[0] if docs else None

        head = await self._call("claim (find the task that failed)", find)
        if head is None:
            return None
        pinned = {"$and": [filter_, {"key": head["key"], "_id": head["key"]}]}

        async def claim_head() -> dict[str, Any] | None:
            doc: dict[str, Any] | None = await self.tasks.find_one_and_update(
                pinned, pipeline, return_document=ReturnDocument.AFTER, hint=KEY_INDEX
            )
            return doc

        try:
            return await self._call("claim (the head alone)", claim_head, recover=recover, retries=0)
        except StorageError as again:
            if not again.document:
                raise
        await self._set_broken(head["key"], "TaskDocumentError", f"the task cannot be claimed: {exc}", now)
        return None

    async def _set_broken(self, key: str, error_type: str, message: str, now: datetime) -> None:
        """Fail a task whose document cannot be written as usual; the reason is kept on the task."""
        log.warning("task %s failed for good: %s", key, message, extra={"key": key})
        broken = {"type": error_type, "message": message[:2000], "traceback": None}
        pipeline = [{"$set": {"state.broken": literal(broken)}}, *derive_stages(now)]
        by_key = one_task(key, self._part(key))
        await self._call("mark task broken", lambda: self.tasks.update_one(by_key, pipeline))

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """Up to ``len(params.attempts)`` claims, sent concurrently (one round trip each, at most
        ``max_parallel_claims`` in flight: more only pile onto the same head document, where the
        losers conflict and the server runs them again). Each claim names one partition
        (``claim_over_parts``: the attempts dealt over the partitions to visit)."""
        tokens_per_lane = len(claimer_tokens(list(params.names), params.worker_id, params.groups))

        async def claim_round(plan: list[ClaimStep]) -> list[ClaimedTask | BaseException | None]:
            if tokens_per_lane > MAX_SCANS:
                return await self._claim_chunked(params, plan)
            return await self._claim_each(params, [(a, None, part, lane) for a, part, lane in plan])

        claimed, errors, failed = await claim_over_parts(params, self.partitions, claim_round)
        if params.uncertain is not None:
            params.uncertain.extend(failed)
        if errors and not claimed:
            raise errors[0]
        if errors:
            # Raising would orphan the claims that were applied (their leases would expire unused,
            # each costing a retry): hand those over; the next claim meets the error again.
            log.warning("claim: %d attempts failed (%s)", len(errors), errors[0])
        return claimed

    async def _claim_each(
        self, params: ClaimParams, plan: Sequence[tuple[str, str | None, int, str | None]]
    ) -> list[ClaimedTask | BaseException | None]:
        """The claims of ``plan`` ((attempt, key or None, partition, lane)), concurrently within
        the cap."""
        if len(plan) <= self.max_parallel_claims:  # within the cap: no gate to pass
            claims = [self._claim_one(params, *step) for step in plan]
            done = await asyncio.gather(*claims, return_exceptions=True)
            self.claims_empty += sum(r is None for r in done)
            return list(done)
        gate = asyncio.Semaphore(self.max_parallel_claims)

        async def one(attempt: str, key: str | None, part: int, lane: str | None) -> ClaimedTask | None:
            async with gate:
                return await self._claim_one(params, attempt, key, part, lane)

        results = await asyncio.gather(*(one(*step) for step in plan), return_exceptions=True)
        self.claims_empty += sum(r is None for r in results)
        return list(results)

    async def _claim_chunked(
        self, params: ClaimParams, plan: list[ClaimStep]
    ) -> list[ClaimedTask | BaseException | None]:
        """A claim over more claimer tokens than the planner merges (``MAX_SCANS``: one index
        range per token; above ``internalQueryMaxScansToExplode``, 200, the server falls back to
        a blocking sort of every due task of every token, each claim and each poll). The tokens
        are split into chunks of at most ``MAX_SCANS``; per partition, each chunk's heads are read
        in the claim order (one bounded read per chunk), merged here, and the first ones claimed
        by key (each claim repeats every condition: a head taken meanwhile is not claimed)."""
        projection = {"key": 1, "state.claim_priority": 1, "state.targeted": 1, "state.order_at": 1}
        steps: list[tuple[str, str | None, int, str | None]] = []
        for part, lane in dict.fromkeys((p, lane) for _, p, lane in plan):
            attempts = [a for a, p, a_lane in plan if p == part and a_lane == lane]
            tokens = claimer_tokens(list(params.names), params.worker_id, params.groups, (lane,))
            heads: list[dict[str, Any]] = []
            for start in range(0, len(tokens), MAX_SCANS):
                filter_ = self._claim_filter(params, tokens[start : start + MAX_SCANS], part)

                async def read(
                    filter_: dict[str, Any] = filter_, n: int = len(attempts)
                ) -> list[dict[str, Any]]:
                    cursor = self.tasks.find(filter_, projection).sort(CLAIM_SORT).limit(n).hint(CLAIM_INDEX)
                    return [doc async for doc in cursor]

                heads += await self._call("claim (read the heads of a chunk)", read)
            heads.sort(key=_claim_order)
            keys: list[str | None] = list(dict.fromkeys(doc["key"] for doc in heads))
            keys = (keys + [None] * len(attempts))[: len(attempts)]
            steps += [(a, k, part, lane) for a, k in zip(attempts, keys, strict=True)]
        claimable = [step for step in steps if step[1] is not None]
        results = dict(zip(claimable, await self._claim_each(params, claimable), strict=True))
        return [results.get(step) for step in steps]

    def _finish_op(self, item: FinishParams) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        now = to_mongo(item.now)
        filter_: dict[str, Any] = {
            **one_task(item.key, self._part(item.key)),
            WORKER_STATES: {
                "$elemMatch": {
                    "worker_id": item.worker_id,
                    "attempt": item.attempt,
                    "status": "running",
                    "ping_expire_time": {"$gt": now},
                }
            },
        }
        # A cancel wins over a later finish (and the other way round): a cancelled task takes only
        # the ``cancelled`` settlement of its attempts, an attempt listed by a stopping pause
        # only its ``released`` one (drivers.base.finish_allowed).
        if item.outcome == "cancelled":
            filter_["state.cancelled"] = {"$ne": None}
        else:
            filter_["state.cancelled"] = None
            if item.outcome != "released":
                filter_["state.stop.attempts"] = {"$ne": item.attempt}
        match = {
            "$and": [
                {"$eq": ["$$e.attempt", literal(item.attempt)]},
                {"$eq": ["$$e.worker_id", literal(item.worker_id)]},
                {"$eq": ["$$e.status", "running"]},
            ]
        }
        changes = {
            "status": item.outcome,
            "end_time": now,  # naive UTC already (the filter's)
            "result": item.result,
            "error": item.error,
            "retry_at": item.retry_at,
            "final": item.final,
        }
        return filter_, [rebuild_entries(match, changes), *derive_stages(item.now, raw=True)]

    async def finish(self, params: Sequence[FinishParams]) -> list[bool]:
        """Write a batch of attempt outcomes in one command per partition (one, unpartitioned);
        says which were accepted (fenced)."""
        if not params:
            return []
        if self.partitions == 1:
            return await self._finish_part(params)
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(params):
            groups.setdefault(self._part(item.key), []).append(i)
        accepted = [False] * len(params)
        for positions in groups.values():
            for i, ok in zip(positions, await self._finish_part([params[i] for i in positions]), strict=True):
                accepted[i] = ok
        return accepted

    async def _finish_part(self, params: Sequence[FinishParams]) -> list[bool]:
        ops = [self._finish_op(item) for item in params]

        async def write() -> Any:
            if len(ops) == 1:
                return await self.tasks.update_one(ops[0][0], ops[0][1])
            return await self.tasks.bulk_write([UpdateOne(f, u) for f, u in ops], ordered=False)

        try:
            result = await self._call("finish", write)
            matched = result.matched_count
        except StorageError as exc:
            if not (exc.transient or exc.document):
                raise
            # outcome unknown, or one outcome too large for its task: read back, then write
            # what did not land one by one (a too-large one is replaced by its failure)
            matched = -1
        if matched == len(ops):
            return [True] * len(ops)
        # Some were rejected (lease lost) or the outcome is unknown: read back which ones landed.
        return await self._finish_outcomes(params)

    async def _finish_outcomes(self, params: Sequence[FinishParams]) -> list[bool]:
        keys = list({item.key for item in params})

        async def read() -> list[dict[str, Any]]:
            projection = {"key": 1, WORKER_STATES: 1, "state.cancelled": 1, "state.stop": 1}
            cursor = self.tasks_primary.find(by_keys(keys, self.partitions), projection)
            return [doc async for doc in cursor]

        docs = {doc["key"]: doc for doc in await self._call("finish read-back", read)}
        outcomes = []
        for item in params:
            state = docs.get(item.key, {}).get("state", {})
            entries = state.get("worker_states", [])
            entry = next((e for e in entries if e["attempt"] == item.attempt), None)
            if (
                entry is not None
                and entry["status"] == "running"
                and from_mongo(entry["ping_expire_time"]) > item.now
            ):
                settled = settlement(state, item.attempt)
                if settled is not None and settled[0] != item.outcome:
                    # Fenced out by a cancel (or a stopping pause): the handler has stopped, so
                    # its attempt is settled as the stop said; the outcome itself is refused.
                    await self._settle_refused(item, *settled)
                    outcomes.append(False)
                    continue
                # Neither applied nor rejected yet (the batch failed): write it alone.
                filter_, update = self._finish_op(item)

                async def write_one(f: dict[str, Any] = filter_, u: list[dict[str, Any]] = update) -> Any:
                    return await self.tasks.update_one(f, u)

                try:
                    single = await self._call("finish", write_one)
                except StorageError as exc:
                    if not exc.document:
                        raise
                    outcomes.append(await self._finish_unstorable(item, exc))
                    continue
                outcomes.append(bool(single.matched_count))
            else:
                outcomes.append(
                    entry is not None
                    and entry["status"] == item.outcome
                    and from_mongo(entry["end_time"]) == item.now
                    and entry["worker_id"] == item.worker_id
                )
        return outcomes

    async def _settle_refused(self, item: FinishParams, status: str, error: dict[str, Any]) -> None:
        """Settle an attempt whose outcome a cancel (or a stopping pause) refused: fenced like a
        finish, with the settlement's status; not raised when it fails (the lease pass settles
        it at the lease's end)."""
        settle = replace(item, outcome=status, result=None, error=error, retry_at=None)
        filter_, update = self._finish_op(settle)
        try:
            await self._call("finish (settle)", lambda: self.tasks.update_one(filter_, update))
        except StorageError as exc:
            if exc.config:
                raise
            log.warning("could not settle the stopped attempt of %s: %s", item.key, exc)

    async def _finish_unstorable(self, item: FinishParams, exc: StorageError) -> bool:
        """An outcome its task's document cannot hold (too large): the attempt fails for good
        with the reason, without result or traceback; if even that cannot be written, the task
        is marked broken. Never raised to the consumer: one bad document must not stop it."""
        log.warning("task %s: outcome not storable (%s); failing it", item.key, exc, extra={"key": item.key})
        error = {
            "type": "OutcomeTooLarge",
            "message": f"the attempt's outcome cannot be stored: {exc}"[:2000],
        }
        fallback = replace(item, outcome="rejected", result=None, error=error | {"traceback": None})
        filter_, update = self._finish_op(fallback)
        try:
            single = await self._call("finish (fallback)", lambda: self.tasks.update_one(filter_, update))
        except StorageError as again:
            if not again.document:
                raise
            await self._set_broken(item.key, "TaskDocumentError", str(again), item.now)
            return False
        return bool(single.matched_count)

    async def _expire_leases_only(self, params: ExpireParams, part: int = 0) -> int:
        """``expire_leases`` of one partition (one shard), without events
        (``MongoEvents.expire_leases`` visits every partition and records them): the running
        entries whose lease ended are settled (``expired_entries_stage``: lost, or cancelled /
        released when they had been told to stop), then those of earlier generations
        (``_expire_history_leases``)."""
        now = to_mongo(params.now)
        filter_ = {
            "part": part,
            WORKER_STATES: {"$elemMatch": {"status": "running", "ping_expire_time": {"$lte": now}}},
        }
        # the retry policy's delay for this failure (lost_retry_at in drivers/base.py):
        # delays[min(fail_cnt, len - 1)] after now, fail_cnt counted before this pass
        delays = {"$ifNull": ["$option.lost_retry_delays_ms", [0]]}
        index = {"$min": ["$state.fail_cnt", {"$subtract": [{"$size": delays}, 1]}]}
        retry_at = {"$add": [literal(params.now), {"$arrayElemAt": [delays, index]}]}
        pipeline = [expired_entries_stage(params.now, retry_at), *derive_stages(params.now)]

        async def expire() -> Any:
            return await self.tasks.update_many(filter_, pipeline, hint=LEASES_INDEX)

        expired = int((await self._call("expire leases", expire)).modified_count)
        return expired + await self._expire_history_leases(params, part)

    async def _expire_history_leases(self, params: ExpireParams, part: int = 0) -> int:
        """Running entries of earlier generations whose lease ended become ``lost`` (one update on
        the partial index ``leases_history``, which holds only documents with such an entry: an
        earlier build moved running entries to ``state.history`` at a restart; this one refuses
        the restart while an attempt holds a live lease and settles the others first)."""
        now = to_mongo(params.now)
        filter_ = {
            "part": part,
            HISTORY_RUNNING: "running",  # implied by the $elemMatch; stated for the partial index
            "state.history.worker_states": {
                "$elemMatch": {"status": "running", "ping_expire_time": {"$lte": now}}
            },
        }
        pipeline = [expired_history_stage(params.now), *derive_stages(params.now)]

        async def expire() -> Any:
            return await self.tasks.update_many(filter_, pipeline, hint=LEASES_HISTORY_INDEX)

        return int((await self._call("expire leases of earlier generations", expire)).modified_count)

    async def _expire_deadlines_only(self, params: ExpireParams, part: int = 0) -> int:
        """Tasks of one partition whose deadline passed while they waited become ``expired``
        (never run late)."""
        now = to_mongo(params.now)
        filter_ = {"part": part, "state.status": "pending", "option.deadline": {"$lte": now}}
        pipeline = [{"$set": {"state.expired_at": literal(params.now)}}, *derive_stages(params.now)]

        async def expire() -> Any:
            return await self.tasks.update_many(filter_, pipeline, hint=DEADLINE_INDEX)

        result = await self._call("expire deadlines", expire)
        return int(result.modified_count)

    # -- discovery ------------------------------------------------------------------------------

    async def find_wakeups(self, params: WakeupParams) -> list[Wakeup]:
        # The wake-up index: equality on this worker's claimer tokens, then claim_at (the
        # ranges are merged in claim_at order, no in-memory sort). Tasks aimed at others are
        # not read. More tokens than a query merges (MAX_SCANS): one read per chunk, merged here.
        tokens = claimer_tokens(list(params.names), params.worker_id, params.groups, params.lanes)
        # every partition (a read may reach every shard): one index range per partition and
        # token, so a read covers at most MAX_SCANS of those (more tokens, or more partitions,
        # than that: several reads, merged here)
        per_read = min(len(tokens), MAX_SCANS)
        parts_per_read = max(1, MAX_SCANS // per_read)
        reads = [
            (list(range(p, min(p + parts_per_read, self.partitions))), tokens[t : t + per_read])
            for p in range(0, self.partitions, parts_per_read)
            for t in range(0, len(tokens), per_read)
        ]
        docs: list[dict[str, Any]] = []
        for parts, some in reads:
            filter_ = {"part": {"$in": parts}, "state.claimers": {"$in": some}}

            async def read(filter_: dict[str, Any] = filter_) -> list[dict[str, Any]]:
                projection = {
                    "_id": 0,
                    "key": 1,
                    "state.claim_at": 1,
                    "option.deadline": 1,
                    "option.fair_key": 1,
                }
                cursor = (
                    self.tasks.find(filter_, projection)
                    .sort("state.claim_at", 1)
                    .limit(params.limit)
                    .hint(WAKEUP_INDEX)
                )
                return [doc async for doc in cursor]

            docs += await self._call("find wake-ups", read)
        if len(reads) > 1:  # the reads' earliest, merged
            by_key = {doc["key"]: doc for doc in docs}
            docs = sorted(by_key.values(), key=_wakeup_order)[: params.limit]
        wakeups = []
        for doc in docs:
            claim_at = doc.get("state", {}).get("claim_at")
            deadline = doc.get("option", {}).get("deadline")
            deadline = from_mongo(deadline) if isinstance(deadline, datetime) else None
            # a document edited by hand must not stop polling; a task past its deadline is never
            # claimed (the claim's rule): no claim wake-up for it
            if isinstance(claim_at, datetime) and (deadline is None or deadline > params.now):
                lane = doc.get("option", {}).get("fair_key")
                wakeups.append(
                    Wakeup(doc["key"], from_mongo(claim_at), "claim", lane if isinstance(lane, str) else None)
                )
            if deadline is not None:  # when the deadline pass should look at it
                wakeups.append(Wakeup(doc["key"], deadline, "deadline"))
        return wakeups

    async def find_lanes(self, params: LaneParams) -> list[str]:
        """The fairness keys of claimable tasks of these names: one ``distinct`` on the partial
        index ``lanes`` (only tasks with a key are in it), a DISTINCT_SCAN: one index seek per
        key, whatever the number of its tasks. ``distinct`` takes no hint before MongoDB 7.1: the
        query states the index's partial filter (``option.fair_key`` exists), which no other
        index can serve."""
        key_range: dict[str, Any] = {"$exists": True, "$type": "string"}
        if params.after is not None:
            key_range["$gt"] = params.after
        filter_ = {
            "option.fair_key": key_range,
            "name": {"$in": list(params.names)},
            "state.claim_at": {"$type": "date"},
        }

        async def read() -> list[str]:
            found = await self.tasks.distinct("option.fair_key", filter_)
            return sorted(k for k in found if isinstance(k, str))[: params.limit]

        return await self._call("find lanes", read)

    def _watch_pipeline(self) -> list[dict[str, Any]]:
        return watch_pipeline()

    _event = staticmethod(change_event)

    def stream_key(self, collection: str) -> Any:
        """Identifies a collection of this store in the process (``drivers/streams.py``): driver
        objects over the same collection of the same client share its change stream."""
        target = self.events if collection == "events" else self.tasks
        client = getattr(self.database, "client", None)
        return (id(client) if client is not None else id(self.database), self.database.name, target.name)

    def watch(
        self, names: Sequence[str], resume_token: Any = None
    ) -> Subscription[ChangeEvent | StreamPosition]:
        """Change events of tasks with these names (and stop requests), and the stream's position
        when it moved on without one: a subscription to the process's one change stream on the
        tasks collection (``drivers/streams.py``), opened by the first subscriber from where the
        stream last was, closed when the last leaves.

        Raises (when iterated) ``ChangeStreamUnsupported`` where the server cannot watch (a
        standalone server); the consumer then relies on polling alone. ``ResumeTokenLost`` when the stream
        cannot resume. Other errors end it with ``StorageError``; the subscriber polls and
        subscribes again. ``resume_token`` opens the stream there when it is not open; a
        subscriber joining an open stream gets what comes next (a shared stream is not rewound)."""
        hub = shared(("tasks", self.stream_key("tasks")), self._open_changes, _token_of_change)
        return hub.subscribe(wanted_by(names), resume_token)

    async def _open_changes(self, resume_token: Any) -> AsyncIterable[ChangeEvent | StreamPosition]:
        kwargs: dict[str, Any] = {}
        if resume_token is not None:
            kwargs["resume_after"] = resume_token
        try:
            stream = await resolved(self.tasks.watch(watch_pipeline(), **kwargs))
        except OperationFailure as exc:
            raise watch_error(exc, resume_token) from exc
        except PyMongoError as exc:
            raise StorageError(f"watch failed: {exc}", transient=is_transient(exc)) from exc
        log.debug("the tasks' change stream opened (resume token: %s)", resume_token is not None)
        return self._changes(stream, resume_token)

    @staticmethod
    async def _changes(stream: Any, resume_token: Any) -> AsyncGenerator[ChangeEvent | StreamPosition, None]:
        try:
            position = resume_token
            while True:
                try:
                    change = await stream.try_next()
                except OperationFailure as exc:
                    raise watch_error(exc, position) from exc
                except PyMongoError as exc:
                    raise StorageError(f"change stream broke: {exc}", transient=True) from exc
                token = stream.resume_token
                if change is None:
                    if not stream.alive:
                        return  # closed or invalidated: the subscribers start afresh
                    if token is not None and token != position:
                        position = token
                        yield StreamPosition(token)
                    continue
                position = token
                event = change_event(change, token)
                yield event if event is not None else StreamPosition(token)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                await resolved(close())


def _token_of_change(source: Any, item: ChangeEvent | StreamPosition) -> Any:
    return item.token


def _wakeup_order(doc: dict[str, Any]) -> tuple[bool, Any, str]:
    """A wake-up read's order (claim_at, a document without one last), then key."""
    claim_at = doc.get("state", {}).get("claim_at")
    return (not isinstance(claim_at, datetime), claim_at if isinstance(claim_at, datetime) else 0, doc["key"])


def _claim_order(doc: dict[str, Any]) -> tuple[Any, ...]:
    """The claim sort (claim priority desc, targeted desc, order time asc), then key, as a sort key."""
    state = doc.get("state", {})
    return (
        -int(state.get("claim_priority") or 0),
        -int(bool(state.get("targeted"))),
        state.get("order_at"),
        doc["key"],
    )
