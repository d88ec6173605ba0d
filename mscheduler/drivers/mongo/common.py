"""Module-level pieces of the Mongo driver: constants, index definitions, error classification,
datetime conversion and the pipeline stages shared by its operations (derived state, claimers,
the change-stream filter). ``mscheduler.drivers.mongo`` holds the ``MongoDriver`` class that uses
them; both are the only modules that know the storage layout."""

from __future__ import annotations

import inspect
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import bson
from bson.datetime_ms import _datetime_to_millis
from bson.errors import InvalidDocument
from bson.raw_bson import RawBSONDocument
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ConnectionFailure,
    ExecutionTimeout,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.model import GROUP_PREFIX, TaskStatus
from mscheduler.domain.partitions import part_of
from mscheduler.domain.state import ANYONE, CHILD_ENDED_BADLY, LANE_MARK, LIVE, TERMINAL, token_name
from mscheduler.drivers.base import (
    ENTRY_FIELDS,
    MAX_HISTORY,
    ChangeEvent,
    ChangeStreamUnsupported,
    ResumeTokenLost,
    cancelled_error,
    event_for,
    lost_error,
    paused_error,
)

log = logging.getLogger("mscheduler.mongo")

T = TypeVar("T")

TASKS = "mscheduler_tasks"
WORKERS = "mscheduler_workers"
META = "mscheduler_meta"  # the store's layout: its partitions, whether it is sharded

WORKER_STATES = "state.worker_states"
TRANSIENT_ERRORS = (AutoReconnect, ConnectionFailure, NetworkTimeout, NotPrimaryError, ExecutionTimeout)
# Server codes that a retry may fix: interrupted / shutting down / not primary / write conflict /
# not yet initialized (94: a replica set that is starting).
TRANSIENT_CODES = frozenset({6, 7, 89, 91, 94, 112, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})
# Write-concern errors worth retrying: the retryable-writes list (the write may not have been
# applied on a majority because the node stepped down or shut down).
RETRYABLE_WRITE_CONCERN_CODES = frozenset({6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})


class WriteMayRollBack(AutoReconnect):
    """A write the primary applied and then answered with a write-concern error saying it stepped
    down or shut down (``RETRYABLE_WRITE_CONCERN_CODES``): a new primary may not have it, and it
    is rolled back. Raised inside a driver operation so that ``_call`` writes it again."""


def may_roll_back(exc: BulkWriteError) -> bool:
    """A bulk write's write-concern errors say the primary stepped down or shut down."""
    return bool(write_concern_codes(exc) & RETRYABLE_WRITE_CONCERN_CODES)


# Configuration errors no retry fixes: unauthorized, auth failed, unknown / unsatisfiable write
# concern, invalid options. A consumer stops on them with the reason at ERROR.
CONFIG_CODES = frozenset({13, 18, 79, 100, 8000})
# One document cannot be written: too large (BSONObjectTooLarge, the result of an update too
# large), or a value BSON cannot hold.
DOCUMENT_CODES = frozenset({10334, 17419, 17420})
# The server cannot watch at all (standalone: 40573; $changeStream unknown: 40415;
# command not supported: 115; change streams disabled on a serverless tier: 376). 303 is not
# here: it is a connection error (a transient one); nor is 94 (NotYetInitialized: a replica set
# that is starting), retried like any passing error.
CHANGE_STREAM_UNSUPPORTED_CODES = frozenset({40573, 40415, 115, 376})
# The stored resume token can no longer be used: start afresh without it and poll once.
CHANGE_STREAM_TOKEN_LOST_CODES = frozenset({286, 280, 260, 9})
MAJORITY_WTIMEOUT_MS = 10_000

# The claim order: priority desc, tasks aimed at the worker first, due time asc (a task that
# ages: priority 0 and its due time moved back by its priority, mscheduler.domain.state).
CLAIM_SORT = [("state.claim_priority", -1), ("state.targeted", -1), ("state.order_at", 1)]
# Index ranges one query may merge in sort order: above the server's internalQueryMaxScansToExplode
# (200) the planner sorts in memory instead (every due task of every range, each claim and poll).
# A claim or wake-up read over more claimer tokens is split into chunks of at most this many.
MAX_SCANS = 200
# Claims of one call in flight at once (Mongo driver's max_parallel_claims).
DEFAULT_PARALLEL_CLAIMS = 8

# Every query names the index that serves its filter and sort (``hint``); see docs/design.md.
CLAIM_INDEX = "claimers_claim"
WAKEUP_INDEX = "claimers_wakeup"
LEASES_INDEX = "leases"
LEASES_HISTORY_INDEX = "leases_history"
HISTORY_RUNNING = "state.history.worker_states.status"
KEY_INDEX = "key"
ATTEMPT_INDEX = "attempt"
STATUS_INDEX = "list_status"
UPDATED_INDEX = "list_updated"
ATTEMPTS_INDEX = "list_attempts"
NAME_INDEX = "list_name"
CREATED_INDEX = "list_created"
WORKER_INDEX = "list_worker"
GROUP_INDEX = "list_group"
DEADLINE_INDEX = "status_deadline"
UNIQUE_LIVE_INDEX = "unique_live"
PARENTS_INDEX = "parents"
FAMILY_INDEX = "family"
STATS_COUNTS_INDEX = "stats_counts"
FINISHED_INDEX = "finished_key"
LANES_INDEX = "lanes"
# An index whose keys or options change keeps its name only if ``setup`` may rebuild it
# (drivers/mongo/indexes.py).


def live_hash(unique_hash: Any) -> dict[str, Any]:
    """The condition "``state.unique_live`` is this hash" in the form the partial index
    ``unique_live`` serves: its filter is ``{$type: "string"}``, and the planner uses a partial
    index only for a query it can prove is inside the filter; an equality on a value is not
    (server matcher/expression_algo.cpp ``isSubsetOf`` has no ``$type`` rule), the ``$type`` is."""
    return {"$eq": unique_hash, "$type": "string"}


# The group listing's partial index holds the aimed tasks only; a query must state the same
# clause for the planner to use (or be hinted to) it.
AIMED_AT_GROUPS = {"option.specific_groups.0": {"$exists": True}}
INDEXES: list[tuple[Any, dict[str, Any]]] = [
    ("key", {"unique": True, "name": KEY_INDEX}),
    # claim: equality on who may claim (this worker's or anyone's token, per name), then the
    # claim order; claim_at bounds the due range. Tasks aimed at others are outside the ranges.
    (
        # key last: the claim's ``key $nin exclude_keys`` is checked on the index keys, so tasks
        # this worker holds or already ran (fan-out) are skipped without fetching them
        # the partition first: a claim names one (a sharded cluster's one shard)
        # claim_at after order_at: a task that ages may be in the order's range before it is due
        # (order_at <= claim_at); its due time is then checked on the index key, not fetched
        [
            ("part", 1),
            ("state.claimers", 1),
            ("state.claim_priority", -1),
            ("state.targeted", -1),
            ("state.order_at", 1),
            ("state.claim_at", 1),
            ("key", 1),
        ],
        {"name": CLAIM_INDEX},
    ),
    # wake-ups: the same equality, then due time (merged across tokens: no in-memory sort)
    ([("part", 1), ("state.claimers", 1), ("state.claim_at", 1)], {"name": WAKEUP_INDEX}),
    # the lease pass, one partition at a time
    (
        [("part", 1), (f"{WORKER_STATES}.status", 1), (f"{WORKER_STATES}.ping_expire_time", 1)],
        {"name": LEASES_INDEX},
    ),
    # running entries of earlier generations (state.history): the lease pass's second range.
    # Partial: only documents holding one (none, unless an earlier build moved a running entry
    # there at a restart), so it is empty and costs nothing
    (
        [("part", 1), (HISTORY_RUNNING, 1), ("state.history.worker_states.ping_expire_time", 1)],
        {"name": LEASES_HISTORY_INDEX, "partialFilterExpression": {HISTORY_RUNNING: "running"}},
    ),
    (f"{WORKER_STATES}.attempt", {"name": ATTEMPT_INDEX}),
    # admin reads: list by status / by name (+ status) / all, newest page by cursor; counts
    ([("state.status", 1), ("state.create_time", 1), ("key", 1)], {"name": STATUS_INDEX}),
    ([("name", 1), ("state.status", 1), ("state.create_time", 1), ("key", 1)], {"name": NAME_INDEX}),
    ([("state.create_time", 1), ("key", 1)], {"name": CREATED_INDEX}),
    # sorted listings (sort=updated, sort=attempts): one range per status, merged in the order
    # of the fields after it. update_time changes with every state change (not with pings), so
    # this index is written as often as the status index is.
    ([("state.status", 1), ("state.update_time", 1), ("key", 1)], {"name": UPDATED_INDEX}),
    (
        [("state.status", 1), ("state.attempt_cnt", 1), ("state.create_time", 1), ("key", 1)],
        {"name": ATTEMPTS_INDEX},
    ),
    # list by worker: multikey on the entries' worker ids, then the listing order (a task with
    # several entries of one worker is returned once: the scan de-duplicates)
    ([(f"{WORKER_STATES}.worker_id", 1), ("state.create_time", 1), ("key", 1)], {"name": WORKER_INDEX}),
    # list by group: multikey on the groups a task is aimed at, then the listing order; partial,
    # so the (many) tasks aimed at no group cost nothing here
    (
        [("option.specific_groups", 1), ("state.create_time", 1), ("key", 1)],
        {"name": GROUP_INDEX, "partialFilterExpression": AIMED_AT_GROUPS},
    ),
    # the deadline pass: pending tasks whose deadline is past. The equality first (ESR): the
    # pass reads a key per pending task past its deadline, not one per past deadline of any
    # status (finished ones included). A null deadline is outside a date range.
    ([("part", 1), ("state.status", 1), ("option.deadline", 1)], {"name": DEADLINE_INDEX}),
    # unique_by="params": one live task per params hash (unique_live is null once finished, and
    # for tasks not unique by params: outside the partial index)
    (
        "state.unique_live",
        {
            "unique": True,
            "name": UNIQUE_LIVE_INDEX,
            "partialFilterExpression": {"state.unique_live": {"$type": "string"}},
        },
    ),
    # child tasks: the reconciler's pass over unfinished parents (parents only: partial)
    (
        [("state.status", 1), ("key", 1)],
        {"name": PARENTS_INDEX, "partialFilterExpression": {"children": {"$exists": True}}},
    ),
    # workflows: the statuses among a map step's items (DISTINCT_SCAN: one key per status) and
    # their results in order (the succeeded ones, by position); children only (partial)
    (
        [("parent", 1), ("state.status", 1), ("position", 1)],
        {"name": FAMILY_INDEX, "partialFilterExpression": {"parent": {"$exists": True}}},
    ),
    # statistics (drivers/mongo_stats.py): counts by name and status with the due pending tasks'
    # claim_at (covered)
    ([("name", 1), ("state.status", 1), ("state.claim_at", 1)], {"name": STATS_COUNTS_INDEX}),
    # finished tasks by finish time: the finished listing (finish_time, key order: one range per
    # terminal status, merged), the stats' tasks finished in a time window (only those are
    # fetched: one range per finished status) and the retention pass's oldest finished tasks of
    # one status. Both of the latter fetch the documents (they filter on name / parent there).
    ([("state.status", 1), ("state.finish_time", 1), ("key", 1)], {"name": FINISHED_INDEX}),
    # fairness: the keys (lanes) of claimable tasks, a DISTINCT_SCAN (``find_lanes``); the
    # listings by key and the statistics' oldest due task per key. Partial: tasks with a key only
    (
        [("option.fair_key", 1), ("name", 1), ("state.claim_at", 1)],
        {"name": LANES_INDEX, "partialFilterExpression": {"option.fair_key": {"$exists": True}}},
    ),
]
INDEX_NAMES = tuple(options["name"] for _, options in INDEXES)
SHARD_KEY = [("part", 1), ("_id", 1)]


def by_keys(keys: Sequence[str], partitions: int) -> dict[str, Any]:
    """The filter of a read of tasks by key: the keys and their partitions, so that a read on a
    sharded store reaches only the shards that hold them."""
    parts = sorted({part_of(key, partitions) for key in keys})
    return {"key": {"$in": list(keys)}, "part": parts[0] if len(parts) == 1 else {"$in": parts}}


def one_task(key: str, part: int | None) -> dict[str, Any]:
    """The filter of a write about one task: its ``_id`` (the key) and its partition, the whole
    shard key ``{part, _id}`` of a sharded store. A single-document update, delete or
    findAndModify with an equality on the full shard key (or on ``_id``) is routed to one shard
    by every server version; one naming only ``part`` needs a mongos that targets by a shard-key
    prefix (``MongoDriver.prepare`` checks it, for the claim, the one write that cannot name
    its task)."""
    return {"_id": key, "part": part}


SHARD_KEY_INDEX = "shard_key"


def task_indexes(sharded: bool) -> list[tuple[Any, dict[str, Any]]]:
    """The tasks' indexes; on a sharded store (docs/scaling.md) a unique index must be prefixed by
    the shard key ``{part: 1, _id: 1}``: ``key`` is unique through ``_id`` already (the key is the
    ``_id``, and a key's partition never changes, so it lives on one shard), and uniqueness by
    params is not offered there (``unique_live`` is a plain index); plus the shard key's index."""
    if not sharded:
        return INDEXES
    plain = []
    for keys, options in INDEXES:
        if options["name"] in (KEY_INDEX, UNIQUE_LIVE_INDEX):
            options = {k: v for k, v in options.items() if k != "unique"}
        plain.append((keys, options))
    return [*plain, (SHARD_KEY, {"name": SHARD_KEY_INDEX})]


# -- datetimes: naive UTC on the wire (as BSON holds them), aware UTC everywhere else -----------


# values that to_mongo and from_mongo pass through as they are, by exact type: most of a document's values,
# skipped without a call (a subclass takes the general path)
AS_IS = frozenset({str, int, float, bool, type(None), bytes})


def to_mongo(value: Any) -> Any:
    """Convert aware datetimes to naive UTC, recursively, for filters and updates."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in AS_IS else to_mongo(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in AS_IS else to_mongo(v) for v in value]
    if isinstance(value, datetime):
        if value.tzinfo is UTC:  # most times: one call, not two
            return value.replace(tzinfo=None)
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, dict):
        return {k: to_mongo(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_mongo(v) for v in value]
    return value


def from_mongo(value: Any) -> Any:
    """Make every datetime read from the database aware (UTC)."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in AS_IS else from_mongo(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in AS_IS else from_mongo(v) for v in value]
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, dict):
        return {k: from_mongo(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_mongo(v) for v in value]
    return value


def from_mongo_in_place(value: Any) -> Any:
    """``from_mongo`` for a document of our own (just decoded, nobody else holds it): its dicts and
    lists are changed where they are, not copied (a third of the cost on a task's document)."""
    kind = type(value)
    if kind is dict:
        for k, v in value.items():  # values replaced, keys unchanged: the iteration holds
            if type(v) not in AS_IS:
                converted = from_mongo_in_place(v)
                if converted is not v:
                    value[k] = converted
        return value
    if kind is list:
        for i, v in enumerate(value):
            if type(v) not in AS_IS:
                converted = from_mongo_in_place(v)
                if converted is not v:
                    value[i] = converted
        return value
    return from_mongo(value)


def literal(value: Any) -> dict[str, Any]:
    return {"$literal": value if type(value) in AS_IS else to_mongo(value)}


# -- pipeline pieces ------------------------------------------------------------------------------


def count_entries(statuses: Sequence[str]) -> dict[str, Any]:
    cond = (
        {"$eq": ["$$e.status", statuses[0]]}
        if len(statuses) == 1
        else {"$in": ["$$e.status", list(statuses)]}
    )
    return {"$size": {"$filter": {"input": f"${WORKER_STATES}", "as": "e", "cond": cond}}}


FAILURE_STATUSES = ["failed", "lost", "rejected"]
_RETRY_STATUSES = [*FAILURE_STATUSES, "snoozed"]  # entries whose retry_at sets the task's


def derive_stages(now: datetime, *, raw: bool = False) -> list[Any]:
    """``mscheduler.domain.state.derive`` as update-pipeline stages (``_build_derive_stages``),
    built once and filled in with ``now`` per write: only the containers on the way to ``now``
    are new, the rest is shared (never changed: PyMongo does not change a pipeline). ``raw``:
    the stages as BSON already (``RawBSONDocument``, ``_RawStages``), which PyMongo copies into
    the command as they are: the same bytes as encoding them each time (a test holds it so)
    without the encoding."""
    if raw:
        return _RAW_DERIVE_STAGES.fill(now)
    stages: list[Any] = _fill(_DERIVE_STAGES, to_mongo(now))
    return stages


# A time no write has (1971-02-03 04:05:06.789 UTC): its 8 BSON bytes mark where a raw stage's
# time goes (``_RawStages``); a template where they would occur by chance elsewhere is refused.
_MARK_TIME = datetime(1971, 2, 3, 4, 5, 6, 789000)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)
_MILLIS = struct.Struct("<q")


def _millis(value: datetime) -> int:
    """What BSON stores for ``value`` (``bson.datetime_ms._datetime_to_millis``: a naive time is
    UTC), by one subtraction instead of a time tuple."""
    return (value - (_EPOCH if value.utcoffset() is not None else _EPOCH_NAIVE)) // _MS


class _RawStages:
    """Pipeline stages as BSON, each either constant or cut where the time of the write goes
    (BSON stores a time as its milliseconds since the epoch, a little-endian int64): per write,
    the time's 8 bytes are put in the cuts. The same bytes as encoding the stages with that time
    (a test compares them), built without encoding anything."""

    def __init__(self, stages: list[dict[str, Any]]) -> None:
        mark = struct.pack("<q", _datetime_to_millis(_MARK_TIME))
        self.constant: list[RawBSONDocument | None] = []
        self.pieces: list[list[bytes]] = []
        for stage in stages:
            times = _count_now(stage)
            encoded = bson.encode(_fill(_template(stage), _MARK_TIME) if times else stage)
            pieces = encoded.split(mark)
            if len(pieces) != times + 1:
                raise AssertionError(f"the time mark occurs {len(pieces) - 1} times, not {times}")
            self.constant.append(None if times else RawBSONDocument(encoded))
            self.pieces.append(pieces)
        self._last: tuple[int | None, tuple[Any, ...]] = (None, ())

    def fill(self, now: datetime) -> list[Any]:
        millis = _millis(now)
        last = self._last  # (millis, stages): one reference, swapped whole (threads share it)
        if last[0] != millis:  # the writes of one batch share their time: built once for them
            mark = _MILLIS.pack(millis)
            last = (
                millis,
                tuple(
                    raw if raw is not None else RawBSONDocument(mark.join(pieces))
                    for raw, pieces in zip(self.constant, self.pieces, strict=True)
                ),
            )
            self._last = last
        return list(last[1])  # the documents are immutable, shared; the list is the caller's


def _count_now(value: Any) -> int:
    if value is _NOW:
        return 1
    if isinstance(value, dict):
        return sum(_count_now(v) for v in value.values())
    if isinstance(value, list):
        return sum(_count_now(v) for v in value)
    return 0


class _Path:
    """A container on the way to the time of a write in a pipeline template (``_template``):
    built anew per write, its other parts shared."""

    __slots__ = ("is_dict", "items")

    def __init__(self, items: Any, is_dict: bool) -> None:
        self.items = items
        self.is_dict = is_dict


class _Now:
    """Where the time of the write goes in a pipeline template."""


_NOW: Any = _Now()


def _holds_now(value: Any) -> bool:
    if value is _NOW:
        return True
    if isinstance(value, dict):
        return any(_holds_now(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_now(v) for v in value)
    return False


def _template(value: Any) -> Any:
    """``value`` (built with ``_NOW`` for the time) as a template for ``_fill``: the containers
    holding ``_NOW`` as ``_Path``, the rest kept as it is (shared by every write)."""
    if not _holds_now(value):
        return value
    if isinstance(value, dict):
        return _Path([(k, _template(v)) for k, v in value.items()], True)
    if isinstance(value, list):
        return _Path([_template(v) for v in value], False)
    return value


def _fill(node: _Path, now: Any) -> Any:
    """A template's ``_Path`` with ``now`` in: new containers on the way, the rest shared."""
    if node.is_dict:
        return {k: now if v is _NOW else _fill(v, now) if type(v) is _Path else v for k, v in node.items}
    return [now if v is _NOW else _fill(v, now) if type(v) is _Path else v for v in node.items]


def _build_derive_stages(now: datetime) -> list[dict[str, Any]]:
    """``mscheduler.domain.state.derive`` as update-pipeline stages."""
    cnt = "$option.concurrent_worker_cnt"
    finished = {"$gte": ["$state.success_cnt", cnt]}
    # null or missing: unlimited ($gt would say any count > null; $ne says missing != null, so the
    # missing case is folded into null first)
    budget = {"$ifNull": ["$option.max_unexpected_retries", None]}
    final_entries = {
        "$filter": {"input": f"${WORKER_STATES}", "as": "e", "cond": {"$eq": ["$$e.final", True]}}
    }
    exhausted = {
        "$or": [
            {"$and": [{"$ne": [budget, None]}, {"$gt": ["$state.fail_cnt", budget]}]},
            {"$gt": ["$state.rejected_cnt", 0]},
            {"$gt": [{"$size": final_entries}, 0]},
            {"$ne": [{"$ifNull": ["$state.broken", None]}, None]},
        ]
    }
    expired = {"$ne": [{"$ifNull": ["$state.expired_at", None]}, None]}
    cancelled = {"$ne": [{"$ifNull": ["$state.cancelled", None]}, None]}
    paused = {"$eq": [{"$ifNull": ["$state.paused", False]}, True]}
    busy = {"$add": ["$state.running_cnt", "$state.success_cnt"]}
    # child tasks (state.family_status): a blocked child, a status marked by hand, a parent
    blocked = {"$eq": [{"$ifNull": ["$state.blocked", False]}, True]}
    marked = {"$ne": [{"$ifNull": ["$state.marked", None]}, None]}
    parent = {"$ne": [{"$ifNull": ["$state.children", None]}, None]}
    return [
        {
            "$set": {
                "state.running_cnt": count_entries(["running"]),
                "state.success_cnt": count_entries(["succeeded"]),
                "state.fail_cnt": count_entries(FAILURE_STATUSES),
                "state.rejected_cnt": count_entries(["rejected"]),
                # Only failures set the retry time (as in derive): the latest of the failures'
                # retry_at ($max of an array skips the nulls of the other entries)
                "state.retry_at": {
                    "$max": {
                        "$map": {
                            "input": f"${WORKER_STATES}",
                            "as": "e",
                            "in": {"$cond": [{"$in": ["$$e.status", _RETRY_STATUSES]}, "$$e.retry_at", None]},
                        }
                    }
                },
                "state.targeted": {
                    "$gt": [
                        {
                            "$add": [
                                {"$size": "$option.specific_worker_ids"},
                                {"$size": {"$ifNull": ["$option.specific_groups", []]}},
                            ]
                        },
                        0,
                    ]
                },
                "state.update_time": literal(now),
            }
        },
        {
            "$set": {
                "state.free_slots": {"$max": [0, {"$subtract": [cnt, busy]}]},
                "state.attempt_cnt": {"$add": [busy, "$state.fail_cnt"]},
                "state.status": {
                    "$switch": {
                        "branches": [
                            {"case": marked, "then": "$state.marked.status"},
                            {"case": cancelled, "then": "cancelled"},
                            {"case": parent, "then": _family_status()},
                            {"case": finished, "then": "succeeded"},
                            {
                                "case": {"$and": [exhausted, {"$eq": ["$state.running_cnt", 0]}]},
                                "then": "failed",
                            },
                            {
                                "case": {"$and": [expired, {"$eq": ["$state.running_cnt", 0]}]},
                                "then": "expired",
                            },
                            {"case": {"$gt": ["$state.running_cnt", 0]}, "then": "running"},
                        ],
                        "default": "pending",
                    }
                },
                "state.claim_at": {
                    "$cond": [
                        {
                            "$or": [
                                finished,
                                exhausted,
                                expired,
                                cancelled,
                                paused,
                                {"$gte": [busy, cnt]},
                                blocked,
                                marked,
                                parent,
                            ]
                        },
                        None,
                        {"$max": ["$option.run_at", "$state.retry_at"]},
                    ]
                },
            }
        },
        # the claimers, and the change stream's marker: ``wake`` counts the writes that made the
        # task claimable by someone new (claimers changed to a non-empty list); it is top-level
        # so that a stream's leading $match on it is pushed down to the oplog scan (see
        # watch_pipeline), where pings and other writes that wake nobody are dropped
        {"$set": {"_claimers": claimers_expression(), **claim_order_fields()}},
        {"$set": {"wake": _wake(), "state.claimers": "$_claimers"}},
        {"$project": {"_claimers": 0}},
        _lifecycle_stage(now),
    ]


WAKE = "wake"
# a task as the drivers hand it out: without the store's own fields (``_id`` is the key; ``wake``
# is the change stream's marker)
TASK_FIELDS = {"_id": 0, WAKE: 0}


def bump_wake() -> dict[str, Any]:
    """``wake`` plus one (the stream passes the write; see ``watch_pipeline``)."""
    return {"$add": [{"$ifNull": [f"${WAKE}", 0]}, 1]}


def _wake() -> dict[str, Any]:
    became_claimable = {
        "$and": [
            {"$gt": [{"$size": "$_claimers"}, 0]},
            {"$ne": ["$_claimers", {"$ifNull": ["$state.claimers", []]}]},
        ]
    }
    # unchanged otherwise (missing stays missing: a write that wakes nobody leaves no trace the
    # stream's filter could see)
    return {"$cond": [became_claimable, bump_wake(), f"${WAKE}"]}


def _lifecycle_stage(now: datetime) -> dict[str, Any]:
    """``mscheduler.domain.state.lifecycle`` as a stage: ``finish_time`` (the write's ``now`` when the
    task first becomes terminal, kept after; null while live) and ``unique_live`` (the params
    hash while live, for the unique partial index ``unique_live``); a parent with a child still
    live has no finish time yet."""
    open_children = {
        "$size": {
            "$filter": {
                "input": {"$ifNull": ["$state.children", []]},
                "as": "c",
                "cond": {"$in": ["$$c.status", list(LIVE)]},
            }
        }
    }
    return {
        "$set": {
            "state.finish_time": {
                "$cond": [
                    {"$and": [{"$in": ["$state.status", list(TERMINAL)]}, {"$eq": [open_children, 0]}]},
                    {"$ifNull": ["$state.finish_time", literal(now)]},
                    None,
                ]
            },
            "state.unique_live": {
                "$cond": [{"$in": ["$state.status", list(LIVE)]}, {"$ifNull": ["$unique_hash", None]}, None]
            },
        }
    }


def _family_status() -> dict[str, Any]:
    """``mscheduler.domain.state.family_status`` over ``state.children`` (a parent's summary)."""

    def children_in(statuses: Sequence[str]) -> dict[str, Any]:
        cond = {"$in": ["$$c.status", list(statuses)]}
        children = {"$ifNull": ["$state.children", []]}
        return {"$size": {"$filter": {"input": children, "as": "c", "cond": cond}}}

    not_succeeded = [s.value for s in TaskStatus if s is not TaskStatus.SUCCEEDED]
    return {
        "$switch": {
            "branches": [
                {"case": {"$eq": [children_in(not_succeeded), 0]}, "then": "succeeded"},
                {"case": {"$gt": [children_in(["running"]), 0]}, "then": "running"},
                {"case": {"$gt": [children_in(CHILD_ENDED_BADLY), 0]}, "then": "failed"},
            ],
            "default": "pending",
        }
    }


def claim_order_fields() -> dict[str, Any]:
    """``state.claim_priority`` and ``state.order_at`` (``mscheduler.domain.state.claim_order``):
    the task's priority and claim time, or for a task that ages (``option.aging_ms``) priority 0
    and its claim time moved back by ``priority x aging`` (``$add`` of a negative duration)."""
    aging = {"$ifNull": ["$option.aging_ms", 0]}
    ages = {"$gt": [aging, 0]}
    claim_at = {"$ifNull": ["$state.claim_at", None]}
    head_start = {"$multiply": [aging, "$option.priority", -1]}
    return {
        "state.claim_priority": {"$cond": [ages, 0, "$option.priority"]},
        "state.order_at": {
            "$cond": [
                {"$or": [{"$eq": [claim_at, None]}, {"$not": [ages]}]},
                claim_at,
                {"$add": ["$state.claim_at", head_start]},
            ]
        },
    }


def claimers_expression() -> dict[str, Any]:
    """``state.claimers`` (see mscheduler.domain.state): ``name|worker`` per allowed worker that holds no
    running or succeeded entry, ``name|*`` for untargeted tasks, [] when not claimable. A $filter
    with ``$in``: the named workers in their order, as ``derive`` lists them (``$setDifference``
    would not keep it)."""
    # with same_worker_may_repeat a success does not bar its worker, a running entry does
    busy_statuses = {"$cond": [{"$eq": ["$option.same_worker_may_repeat", True]}, ["running"], BUSY]}
    busy_workers = {
        "$map": {
            "input": {
                "$filter": {
                    "input": f"${WORKER_STATES}",
                    "as": "e",
                    "cond": {"$in": ["$$e.status", busy_statuses]},
                }
            },
            "as": "e",
            "in": "$$e.worker_id",
        }
    }
    # the busy workers once per write, not once per named worker (a $let, not inside the
    # $filter's condition: O(workers + entries), not O(workers x entries))
    allowed_now = {
        "$let": {
            "vars": {"busy": busy_workers},
            "in": {
                "$filter": {
                    "input": "$option.specific_worker_ids",
                    "as": "w",
                    "cond": {"$eq": [{"$in": ["$$w", "$$busy"]}, False]},
                }
            },
        }
    }
    groups = {
        "$map": {
            "input": {"$ifNull": ["$option.specific_groups", []]},
            "as": "g",
            "in": {"$concat": [GROUP_PREFIX, "$$g"]},
        }
    }
    who = {"$cond": ["$state.targeted", {"$concatArrays": [allowed_now, groups]}, [ANYONE]]}
    # a task with a fairness key: "<name>#<key>|<who>" (its lane)
    fair_key = {"$ifNull": ["$option.fair_key", None]}
    head = {
        "$cond": [{"$eq": [fair_key, None]}, "$name", {"$concat": ["$name", LANE_MARK, "$option.fair_key"]}]
    }
    return {
        "$cond": [
            {"$eq": [{"$ifNull": ["$state.claim_at", None]}, None]},
            [],
            {
                "$let": {
                    "vars": {"head": head},
                    "in": {"$map": {"input": who, "as": "w", "in": {"$concat": ["$$head", "|", "$$w"]}}},
                }
            },
        ]
    }


BUSY = ["running", "succeeded"]
FINISHED = ("succeeded", "failed")
ALL_STATUSES = [status.value for status in TaskStatus]


_ENTRY_REFS = {f: f"$$e.{f}" for f in ENTRY_FIELDS}  # each field of an entry as it is


def rebuild_entries(
    match: dict[str, Any], changes: dict[str, Any], expressions: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``$set`` of worker_states where entries matching ``match`` get ``changes`` (literals) and
    ``expressions`` (evaluated; our own, never user data)."""
    rebuilt = _ENTRY_REFS | {f: literal(v) for f, v in changes.items()}  # in ENTRY_FIELDS' order
    if expressions:
        rebuilt |= expressions
    return {
        "$set": {
            WORKER_STATES: {
                "$map": {"input": f"${WORKER_STATES}", "as": "e", "in": {"$cond": [match, rebuilt, "$$e"]}}
            }
        }
    }


def expired_entries_stage(now: datetime, retry_at: Any) -> dict[str, Any]:
    """``drivers.base.expired_entry_changes`` as a stage: the running entries whose lease ended at
    ``now`` are settled — ``cancelled`` on a cancelled task, ``released`` (``Paused``) when a
    stopping pause listed them (nothing was lost), else ``lost`` with ``retry_at`` (an expression:
    the policy's delay after ``now``)."""
    match = {"$and": [{"$eq": ["$$e.status", "running"]}, {"$lte": ["$$e.ping_expire_time", literal(now)]}]}
    cancelled = {"$ne": [{"$ifNull": ["$state.cancelled", None]}, None]}
    paused = {
        "$and": [
            {"$eq": [{"$ifNull": ["$state.stop.action", None]}, "pause"]},
            {"$in": ["$$e.attempt", {"$ifNull": ["$state.stop.attempts", []]}]},
        ]
    }

    def by_cause(if_cancelled: Any, if_paused: Any, if_lost: Any) -> dict[str, Any]:
        branches = [{"case": cancelled, "then": if_cancelled}, {"case": paused, "then": if_paused}]
        return {"$switch": {"branches": branches, "default": if_lost}}

    expressions = {
        "status": by_cause("cancelled", "released", "lost"),
        "error": by_cause(literal(cancelled_error()), literal(paused_error()), literal(lost_error())),
        "retry_at": by_cause(None, None, retry_at),
    }
    return rebuild_entries(match, {"end_time": now}, expressions)


def with_history_record(record: dict[str, Any]) -> dict[str, Any]:
    """``state.history`` with ``record`` (an expression of the generation that ends) appended,
    the last ``MAX_HISTORY`` kept: a bounded document."""
    appended = {"$concatArrays": [{"$ifNull": ["$state.history", []]}, [record]]}
    return {"$slice": [appended, -MAX_HISTORY]}


def reset_pipeline(
    doc: dict[str, Any], state: dict[str, Any], now: datetime, by: str | None
) -> list[dict[str, Any]]:
    """A reset of a task that ended (``InsertParams.reset_finished``) as an update pipeline: the
    new params, option and derived ``state`` fields of ``doc``, a new generation, and the ending
    generation's attempts kept in ``state.history`` with when and by whom (the memory driver's
    ``reset_record``)."""
    generation = {"$ifNull": ["$state.generation", 0]}
    record = {
        "generation": generation,
        "restart_time": literal(now),
        "worker_states": f"${WORKER_STATES}",
        "action": literal("reset"),
        "by": literal(by),
    }
    changes: dict[str, Any] = {
        "params": literal(doc["params"]),
        "option": literal(doc["option"]),
        "unique_hash": literal(doc["unique_hash"]),
        **{f"state.{k}": literal(v) for k, v in state.items()},
        "state.generation": {"$add": [generation, 1]},
        # claimable again: the change stream passes it
        WAKE: bump_wake(),
    }
    # a fresh run starts from scratch: no checkpoint, no progress (and a status set by hand ends
    # with the generation, as a restart's does)
    cleared = ("state.broken", "state.marked", "state.checkpoint", "state.progress")
    # the record first, in a stage of its own: it reads the attempts the next stage replaces
    return [
        {"$set": {"state.history": with_history_record(record)}},
        {"$set": changes},
        {"$project": dict.fromkeys(cleared, 0)},
    ]


def expired_history_stage(now: datetime) -> dict[str, Any]:
    """The running entries of earlier generations (``state.history``) whose lease ended become
    ``lost``: an attempt is never left running for ever, whichever generation holds it (entries
    rebuilt field by field, as ``rebuild_entries`` does)."""
    match = {"$and": [{"$eq": ["$$e.status", "running"]}, {"$lte": ["$$e.ping_expire_time", literal(now)]}]}
    changes = {"status": "lost", "end_time": now, "error": lost_error()}
    lost = {f: literal(changes[f]) if f in changes else f"$$e.{f}" for f in ENTRY_FIELDS}
    entries = {"$map": {"input": "$$h.worker_states", "as": "e", "in": {"$cond": [match, lost, "$$e"]}}}
    generation = {
        "generation": "$$h.generation",
        "restart_time": "$$h.restart_time",
        "worker_states": entries,
        "action": "$$h.action",  # a reset's (absent fields stay absent)
        "by": "$$h.by",
    }
    history = {"$map": {"input": "$state.history", "as": "h", "in": generation}}
    return {"$set": {"state.history": history}}


def has_error_label(exc: BaseException, label: str) -> bool:
    return bool(getattr(exc, "has_error_label", lambda _: False)(label))


def write_concern_only(exc: BaseException | None) -> bool:
    """A write's error says only that its write concern was not satisfied: the write was applied on
    the primary (a ``WriteConcernError``, or a ``BulkWriteError`` - code 65 - with write-concern
    errors and no write error). Its outcome is learnt by reading back, never by failing."""
    if isinstance(exc, WriteConcernError):
        return True
    if isinstance(exc, BulkWriteError):
        return not exc.details.get("writeErrors") and bool(exc.details.get("writeConcernErrors"))
    return False


def is_transient(exc: PyMongoError) -> bool:
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    if write_concern_only(exc):
        # Only the retryable codes: 64 (wtimeout) means applied on the primary but not yet on a
        # majority (retrying would wait again); 79 / 100 are configuration errors.
        codes = write_concern_codes(exc)
        retryable = bool(codes) and codes <= RETRYABLE_WRITE_CONCERN_CODES
        return retryable or has_error_label(exc, "RetryableWriteError")
    if isinstance(exc, OperationFailure) and exc.code in TRANSIENT_CODES:
        return True
    return has_error_label(exc, "RetryableWriteError")


def write_concern_codes(exc: BaseException) -> set[int]:
    if isinstance(exc, WriteConcernError):
        return {exc.code} if exc.code is not None else set()
    if isinstance(exc, BulkWriteError):
        return {e.get("code") for e in exc.details.get("writeConcernErrors", []) if e.get("code")}
    return set()


def storage_error(what: str, exc: Exception) -> StorageError:
    """A driver error as a StorageError, classified (see StorageError)."""
    if isinstance(exc, InvalidDocument):  # DocumentTooLarge and unencodable values: not PyMongoErrors
        return StorageError(f"{what} failed: {exc}", document=True)
    code = getattr(exc, "code", None)
    if isinstance(exc, BulkWriteError):
        codes = {e.get("code") for e in exc.details.get("writeErrors", [])}
        if codes and codes <= DOCUMENT_CODES:
            return StorageError(f"{what} failed: {exc}", document=True)
    if code in CONFIG_CODES or write_concern_codes(exc) & CONFIG_CODES:
        return StorageError(f"{what} failed (configuration): {exc}", config=True)
    if code in DOCUMENT_CODES:
        return StorageError(f"{what} failed: {exc}", document=True)
    transient = isinstance(exc, PyMongoError) and is_transient(exc)
    return StorageError(f"{what} failed: {exc}", transient=transient)


# The operators' reads (listings, counts, statistics) run at most this long on the server
# (maxTimeMS): a read an index cannot bound (a statistics window over millions of tasks, a skip
# deep into a listing) is stopped there instead of running on, and not retried.
ADMIN_READ_MS = 10_000


async def admin_read(what: str, read: Callable[[], Awaitable[T]], ms: int = ADMIN_READ_MS) -> T:
    """``read()``, whose commands carry ``maxTimeMS``; the server's refusal past it (50,
    MaxTimeMSExpired: a transient error for the scheduler's own reads) is not retried here."""
    try:
        return await read()
    except ExecutionTimeout as exc:
        raise StorageError(f"{what} ran longer than {ms} ms (maxTimeMS): narrow it") from exc


async def read_page(
    collection: Any, filter_: dict[str, Any], sort: list[tuple[str, int]], skip: int, limit: int, index: str
) -> list[dict[str, Any]]:
    """One page of documents (no ``_id``), in ``sort`` order, read through the named index (an
    operator's read: within ``ADMIN_READ_MS``)."""

    async def read() -> list[dict[str, Any]]:
        cursor = collection.find(filter_, TASK_FIELDS).sort(sort).skip(skip).limit(limit).hint(index)
        return [from_mongo(doc) async for doc in cursor.max_time_ms(ADMIN_READ_MS)]

    return await admin_read("a listing", read)


async def resolved(value: Any) -> Any:
    """PyMongo async returns coroutines where Motor returns cursors: accept both."""
    return await value if inspect.isawaitable(value) else value


def stop_expression(action: str, now: datetime) -> dict[str, Any]:
    """``drivers.base.stop_record`` as a pipeline expression, over the entries before the change:
    {action, time, attempts of the running entries}, or null when nothing runs."""
    running = {
        "$filter": {"input": f"${WORKER_STATES}", "as": "e", "cond": {"$eq": ["$$e.status", "running"]}}
    }
    attempts = {"$map": {"input": running, "as": "e", "in": "$$e.attempt"}}
    record = {"action": literal(action), "time": literal(now), "attempts": attempts}
    return {"$cond": [{"$gt": [{"$size": attempts}, 0]}, record, None]}


STOP_ACTIONS = ["cancel", "pause"]


def wake_if_stopping(action: str, now: datetime) -> dict[str, Any]:
    """``wake`` bumped when a cancel or a stopping pause asks running attempts to stop (so the
    change stream passes the write); left as it is when nothing runs."""
    return {"$cond": [{"$eq": [stop_expression(action, now), None]}, f"${WAKE}", bump_wake()]}


def watch_pipeline() -> list[dict[str, Any]]:
    """The tasks collection's change stream, one per process (``drivers/streams.py``: every
    consumer, waiting lease and subscriber of the process shares it and filters it by name).

    It leads with a ``$match`` the server pushes down to its oplog scan (a predicate on
    ``operationType``, and on a top-level field of ``updateDescription.updatedFields``: the rewrite
    the server makes, SERVER-56872; a ``$match`` after any other stage, or on a dotted path such as
    ``state.claimers``, is evaluated on every event after it was built): inserts, and updates that
    changed the top-level ``wake``. ``wake`` is bumped by a write that made the task claimable by
    someone new (its claimers changed to a non-empty list: a retry, a release, an edit) or that
    asks running attempts to stop (a cancel or a stopping pause sets ``state.stop``). Pings,
    claims, finishes that end a task, checkpoints: no event is built for them.

    No ``fullDocument: updateLookup`` (a document fetch per update). An update's event carries the
    changed claimers (``state.claimers``, or ``state.claimers.<i>`` when the server reports array
    elements), ``state.claim_at`` and ``state.stop``, read from the updated fields' dotted keys
    through ``$objectToArray`` — or from a whole ``state`` object, which the server's diff of a
    pipeline update reports instead of its fields when most of them changed; the event is
    projected to what ``change_event`` reads."""
    updated = {"$objectToArray": {"$ifNull": ["$updateDescription.updatedFields", {}]}}

    def values_of(cond: dict[str, Any]) -> dict[str, Any]:
        fields = {"$filter": {"input": updated, "as": "f", "cond": cond}}
        return {"$map": {"input": fields, "as": "f", "in": "$$f.v"}}

    def field(path: str) -> dict[str, Any]:
        """The new value of ``state.<path>``: an updated field of its own, else the field of a
        whole ``state`` reported as updated (missing: null)."""
        own = {"$arrayElemAt": [values_of({"$eq": ["$$f.k", f"state.{path}"]}), 0]}
        state = {"$arrayElemAt": [values_of({"$eq": ["$$f.k", "state"]}), 0]}
        return {"$ifNull": [own, {"$let": {"vars": {"s": state}, "in": f"$$s.{path}"}}]}

    # the whole array ("state.claimers", or in a whole "state") and / or its elements
    # ("state.claimers.0", ...)
    whole = {"$ifNull": [field("claimers"), []]}
    elements = values_of({"$regexMatch": {"input": "$$f.k", "regex": r"^state\.claimers\.[0-9]+$"}})
    tokens = {"$concatArrays": [whole, elements]}
    claim_at = field("claim_at")
    stop = field("stop")
    # a server may report an object that changed by its fields ("state.stop.time"): a stop
    # whose attempts are not known (the consumer asks the store by pinging)
    stop_fields = values_of({"$regexMatch": {"input": "$$f.k", "regex": r"^state\.stop\."}})
    return [
        {
            "$match": {
                "$or": [
                    {"operationType": {"$in": ["insert", "replace"]}},
                    {"operationType": "update", f"updateDescription.updatedFields.{WAKE}": {"$exists": True}},
                ]
            }
        },
        {
            "$addFields": {
                "ms.claimers": tokens,
                "ms.claim_at": claim_at,
                "ms.partial": {"$gt": [{"$size": elements}, 0]},
                "ms.stop": stop,
                "ms.stop_partial": {"$gt": [{"$size": stop_fields}, 0]},
            }
        },
        {
            "$project": {
                "operationType": 1,
                "documentKey": 1,
                "ms": 1,
                "fullDocument.key": 1,
                "fullDocument.name": 1,
                "fullDocument.option.specific_worker_ids": 1,
                "fullDocument.option.deadline": 1,
                "fullDocument.state.claim_at": 1,
                "fullDocument.state.claimers": 1,
                "fullDocument.state.claim_priority": 1,
                "fullDocument.state.worker_states.status": 1,
                "fullDocument.state.worker_states.ping_expire_time": 1,
            }
        },
    ]


def change_event(change: dict[str, Any], token: Any) -> ChangeEvent | None:
    """A change as a ChangeEvent; None for what cannot be read (a document of another shape)."""
    try:
        if change["operationType"] == "update":
            key = change["documentKey"]["_id"]
            claimers = tuple(str(t) for t in change["ms"]["claimers"])
            stop, stop_attempts = _stop_of(change["ms"])
            if not isinstance(key, str) or not (claimers or stop):
                return None
            claim_at = change["ms"].get("claim_at")
            return ChangeEvent(
                key=key,
                # a stop alone does not name the task's name (the consumer looks it up by key)
                name=token_name(claimers[0]) if claimers else "",
                claim_at=from_mongo(claim_at) if isinstance(claim_at, datetime) else None,
                lease_expiry=None,
                specific_worker_ids=(),
                token=token,
                claimers=claimers,
                claimers_complete=not change["ms"].get("partial", False),
                stop=stop,
                stop_attempts=stop_attempts,
            )
        return event_for(from_mongo(change["fullDocument"]), token=token)
    except (KeyError, TypeError, AttributeError, IndexError):
        return None


def _stop_of(ms: dict[str, Any]) -> tuple[str | None, tuple[str, ...] | None]:
    """The stop request an update carries: (action, attempts); ("unknown", None) when the server
    reported it field by field; (None, None) when there is none."""
    stop = ms.get("stop")
    if isinstance(stop, dict) and stop.get("action") in STOP_ACTIONS:
        return str(stop["action"]), tuple(str(a) for a in stop.get("attempts") or ())
    if ms.get("stop_partial"):
        return "unknown", None
    return None, None


def watch_error(exc: OperationFailure, token: Any) -> Exception:
    # by code only: an error's text naming the replica set (94, NotYetInitialized, while a set
    # starts) is a passing state, reopened with backoff, not "no change streams here"
    if exc.code in CHANGE_STREAM_UNSUPPORTED_CODES:
        return ChangeStreamUnsupported(str(exc))
    if token is not None and (exc.code in CHANGE_STREAM_TOKEN_LOST_CODES or not is_transient(exc)):
        # history lost, or a token the server cannot parse (50811, 40647, 40649, ...): any
        # refusal of a given token that a retry will not fix means "start afresh"
        return ResumeTokenLost(str(exc))
    return StorageError(f"change stream failed: {exc}", transient=is_transient(exc) or exc.code == 303)


# the stages of derive_stages as templates: dicts, and raw BSON
_DERIVE_STAGES = _template(_build_derive_stages(_NOW))
_RAW_DERIVE_STAGES = _RawStages(_build_derive_stages(_NOW))
