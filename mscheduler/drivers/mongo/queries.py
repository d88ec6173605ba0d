"""Operator reads and changes of ``MongoDriver`` on the tasks collection: get, list, count,
live option changes and the operators' compare-and-set controls (cancel, pause, resume, remove,
restart). The claim path lives in ``mongo.py``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.listing import (
    BY_ATTEMPTS,
    BY_FINISHED,
    BY_KEY,
    BY_NAME,
    BY_STATUS,
    BY_UPDATED,
    ORDER_FIELDS,
    ListParams,
    prefix_end,
)
from mscheduler.domain.state import TERMINAL
from mscheduler.drivers.base import (
    MAX_HISTORY,
    ControlParams,
    UniqueParamsTaken,
    UpdateOptionParams,
    cancelled_record,
)
from mscheduler.drivers.mongo.common import (
    ADMIN_READ_MS,
    AIMED_AT_GROUPS,
    ALL_STATUSES,
    ATTEMPTS_INDEX,
    CREATED_INDEX,
    FINISHED_INDEX,
    GROUP_INDEX,
    KEY_INDEX,
    NAME_INDEX,
    STATUS_INDEX,
    TASK_FIELDS,
    UPDATED_INDEX,
    WAKE,
    WORKER_INDEX,
    WORKER_STATES,
    T,
    admin_read,
    by_keys,
    derive_stages,
    expired_entries_stage,
    from_mongo,
    literal,
    live_hash,
    one_task,
    read_page,
    resolved,
    stop_expression,
    to_mongo,
    wake_if_stopping,
)


def list_query(params: ListParams) -> tuple[dict[str, Any], list[tuple[str, int]], str]:
    """The filter, sort and index of a task listing (docs/design.md, "Listing tasks").

    One index serves each listing's order (``params.order``, either direction: an index is read
    backwards as well), so no listing sorts in memory:

    * key order (``key_prefix``, or ``sort=key``): the ``key`` index (the prefix's range of it);
    * finish-time order (a finished range, or ``sort=finished``): the ``finished_key`` index
      (status, finish_time, key), with the status or every terminal status listed, so the
      per-status ranges merge in (finish_time, key) order;
    * creation order: the worker index (``worker_id``), the group index (``group``, partial:
      the query states its clause), the name index (``name``, with every status listed when no
      status is given), the status index, or the created index;
    * ``sort=updated``: ``list_updated`` (status, update_time, key), every status listed
      unless one is given (merged, as in the finished order);
    * ``sort=attempts``: ``list_attempts`` (status, attempt_cnt, create_time, key), the same way;
    * ``sort=status``: ``list_status`` (status, create_time, key) in its own order;
    * ``sort=name``: ``list_name`` (name, status, create_time, key) in its own order.

    The order's time range and the cursor bound its leading field inside that index; filters the
    chosen index does not hold are checked on the documents it yields."""
    filter_: dict[str, Any] = {}
    order_by = params.order
    way = -1 if params.descending else 1
    fields = ORDER_FIELDS[order_by]
    index = _INDEX_OF.get(order_by) or _creation_index(params)
    if order_by == BY_KEY:
        key_range = _key_range(params)
        if key_range:
            filter_["key"] = key_range
    order = [(path, way) for path in (*fields.rank, *((fields.time,) if fields.time else ()), "key")]
    if params.worker_id is not None:
        filter_[f"{WORKER_STATES}.worker_id"] = params.worker_id
    if params.group is not None:
        filter_["option.specific_groups"] = params.group
        filter_.update(AIMED_AT_GROUPS)  # implied by the equality; stated for the partial index
    if params.name is not None:
        filter_["name"] = params.name
    if params.status is not None:
        filter_["state.status"] = params.status
    elif index in (UPDATED_INDEX, ATTEMPTS_INDEX) or (index == NAME_INDEX and order_by != BY_NAME):
        filter_["state.status"] = {"$in": ALL_STATUSES}  # one range per status, merged in order
    elif index == FINISHED_INDEX:
        filter_["state.status"] = {"$in": list(TERMINAL)}  # only these have a finish time
    created = _time_range(
        params.created_from, params.created_to, params, fields.time == "state.create_time" and not fields.rank
    )
    if created:
        filter_["state.create_time"] = created
    finished = _time_range(params.finished_from, params.finished_to, params, order_by == BY_FINISHED)
    if finished:
        filter_["state.finish_time"] = finished
    elif order_by == BY_FINISHED:
        filter_["state.finish_time"] = {"$type": "date"}  # a status given: its finished tasks only
    position = params.after
    if order_by != BY_KEY and position is not None:
        filter_ = _after(order, position, params.descending, filter_)
    return to_mongo(filter_), order, index


_INDEX_OF = {
    BY_KEY: KEY_INDEX,
    BY_FINISHED: FINISHED_INDEX,
    BY_UPDATED: UPDATED_INDEX,
    BY_ATTEMPTS: ATTEMPTS_INDEX,
    BY_STATUS: STATUS_INDEX,
    BY_NAME: NAME_INDEX,
}


def _creation_index(params: ListParams) -> str:
    """The index of a listing in creation order: the most selective filter's."""
    if params.worker_id is not None:
        return WORKER_INDEX
    if params.group is not None:
        return GROUP_INDEX
    if params.name is not None:
        return NAME_INDEX
    if params.status is not None:
        return STATUS_INDEX
    return CREATED_INDEX


def _key_range(params: ListParams) -> dict[str, Any]:
    """The key index's range: the prefix's, from the cursor on (up or down)."""
    bounds: dict[str, Any] = {}
    if params.key_prefix is not None:
        bounds["$gte"] = params.key_prefix
        end = prefix_end(params.key_prefix)
        if end is not None:
            bounds["$lt"] = end
    if params.after_key is not None:
        if not params.descending:
            bounds["$gt"] = params.after_key
        else:
            bounds["$lt"] = min(bounds.get("$lt", params.after_key), params.after_key)
    return bounds


def _after(
    order: list[tuple[str, int]], position: tuple[Any, ...], descending: bool, filter_: dict[str, Any]
) -> dict[str, Any]:
    """The cursor as a filter: one ``$or`` branch per sort field (past it in the first field; as
    far in the first and past it in the second; ...), each with every filter. Many tasks may tie
    on a leading field (one status; one creation time for a batch sent at once), so a bound on
    the first field alone would read all of those before the cursor; each branch instead is a
    tight range of the hinted index, and the server merges the branches in the index's order
    (a deep page costs what the first does)."""
    past = "$lt" if descending else "$gt"
    paths = [path for path, _ in order]
    branches = []
    for n, path in enumerate(paths):
        clause: dict[str, Any] = {p: position[i] for i, p in enumerate(paths[:n])}
        clause[path] = {past: position[n]}
        shared = set(clause) & set(filter_)
        branches.append({**filter_, **clause} if not shared else {"$and": [filter_, clause]})
    return {"$or": branches}


def _time_range(
    start: datetime | None, end: datetime | None, params: ListParams, ordered: bool
) -> dict[str, Any]:
    """``{$gte, $lt}`` of a ``[start, end)`` range; in the listing's own order, the cursor's
    time moves the bound it goes towards (the index range starts at the cursor)."""
    bounds: dict[str, Any] = {}
    if start is not None:
        bounds["$gte"] = start
    if end is not None:
        bounds["$lt"] = end
    if ordered and params.after_time is not None:
        if params.descending:
            bounds["$lte"] = params.after_time
        else:
            bounds["$gte"] = params.after_time if start is None else max(start, params.after_time)
    return bounds


class MongoTaskQueries:
    """Task reads and operator changes of ``MongoDriver`` (a mixin: it uses ``_call``, ``tasks``)."""

    tasks: Any
    tasks_primary: Any

    if TYPE_CHECKING:

        @property
        def partitions(self) -> int: ...

        def _part(self, key: str) -> int: ...

        async def _call(
            self,
            what: str,
            operation: Callable[[], Awaitable[T]],
            *,
            recover: Callable[[], Awaitable[T | None]] | None = None,
            session: Any = None,
        ) -> T: ...

    # A task by key is read from the primary whatever the client's read preference: these reads
    # decide (a remote executor's ping renews from the options read, a report reads the failures
    # before its attempt, the publisher re-reads what it sent); a lagging secondary would answer
    # with the task as it was.

    async def get_task(self, key: str) -> dict[str, Any] | None:
        one = {"key": key, "part": self._part(key)}
        doc = await self._call("get task", lambda: self.tasks_primary.find_one(one, TASK_FIELDS))
        return from_mongo(doc) if doc is not None else None

    async def get_tasks(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            filter_ = by_keys(list(dict.fromkeys(keys)), self.partitions)
            cursor = self.tasks_primary.find(filter_, TASK_FIELDS).hint(KEY_INDEX)
            return [from_mongo(doc) async for doc in cursor]

        return await self._call("get tasks", read)

    async def list_tasks(self, params: ListParams) -> list[dict[str, Any]]:
        filter_, order, index = list_query(params)
        return await self._call(
            "list tasks", lambda: read_page(self.tasks, filter_, order, 0, params.limit, index)
        )

    async def count_tasks(self, params: ListParams, cap: int) -> int:
        # The listing's filter on its index, without cursor or sort: the keys of the selected
        # range are counted (no document fetched when the index holds every filter), up to cap.
        unpaged = replace(params, after_key=None, after_time=None, after_rank=None)
        filter_, _, index = list_query(unpaged)

        async def count() -> int:
            return int(
                await self.tasks.count_documents(filter_, limit=cap, hint=index, maxTimeMS=ADMIN_READ_MS)
            )

        return await self._call("count tasks", lambda: admin_read("count tasks", count))

    async def count_by_status(self) -> dict[str, int]:
        # Covered by the status index: keys only, no document is fetched.
        pipeline = [
            {"$match": {"state.status": {"$in": ALL_STATUSES}}},
            {"$group": {"_id": "$state.status", "n": {"$sum": 1}}},
        ]

        async def read() -> dict[str, int]:
            cursor = await resolved(
                self.tasks.aggregate(pipeline, hint=STATUS_INDEX, maxTimeMS=ADMIN_READ_MS)
            )
            return {doc["_id"]: doc["n"] async for doc in cursor}

        return await self._call("count by status", lambda: admin_read("count by status", read))

    async def update_option(self, params: UpdateOptionParams) -> bool:
        pipeline = [{"$set": {"option": literal(params.option)}}, *derive_stages(params.now)]

        async def update() -> Any:
            return await self.tasks.update_one(one_task(params.key, self._part(params.key)), pipeline)

        try:
            result = await self._call("update option", update)
        except DuplicateKeyError as exc:  # the unique index unique_live: a revived task's params are taken
            raise UniqueParamsTaken(params.key, await self._unique_holder_of(params.key)) from exc
        return bool(result.matched_count)

    async def control_task(self, params: ControlParams) -> dict[str, Any] | None:
        # The filter is the compare-and-set: the key in one of the allowed statuses.
        filter_: dict[str, Any] = {
            **one_task(params.key, self._part(params.key)),
            "state.status": {"$in": list(params.statuses)},
        }
        if params.action == "remove":
            return await self._remove_task(params, filter_)
        now = literal(params.now)
        now_out = to_mongo(params.now)
        change: dict[str, Any]
        stages: list[dict[str, Any]] = []
        if params.action == "cancel":
            change = {
                "state.cancelled": literal(cancelled_record(params)),
                "state.stop": stop_expression("cancel", params.now),
                WAKE: wake_if_stopping("cancel", params.now),  # the change stream passes it
            }
        elif params.action == "pause" and params.stop_running:
            # paused, and the running attempts told to stop (state.stop, for the change stream and
            # the pings): each keeps its entry (and its slot) until its worker settles it released
            # once the handler stopped, or the lease pass at its lease's end
            change = {
                "state.paused": True,
                "state.stop": stop_expression("pause", params.now),
                WAKE: wake_if_stopping("pause", params.now),
            }
        elif params.action in ("pause", "resume"):
            change = {"state.paused": literal(params.action == "pause")}
            if params.action == "resume":
                change["state.stop"] = None
        elif params.action == "restart":
            # never while an attempt holds a live lease (refused: Operations names it); the
            # running entries whose holders are gone are settled first, as the lease pass would
            live = {"$elemMatch": {"status": "running", "ping_expire_time": {"$gt": now_out}}}
            filter_["$nor"] = [{WORKER_STATES: live}, {"state.history.worker_states": live}]
            stages = [expired_entries_stage(params.now, literal(params.now))]
            generation = {"$ifNull": ["$state.generation", 0]}
            record = {"generation": generation, "restart_time": now, "worker_states": f"${WORKER_STATES}"}
            change = {
                "state.history": {
                    "$slice": [  # the last MAX_HISTORY generations: a bounded document
                        {
                            "$concatArrays": [
                                {"$ifNull": ["$state.history", []]},
                                [record],
                            ]
                        },
                        -MAX_HISTORY,
                    ]
                },
                "state.generation": {"$add": [generation, 1]},
                WORKER_STATES: literal([]),
                "state.cancelled": None,
                "state.expired_at": None,
                "state.broken": None,
                "state.marked": None,  # a status set by hand (child tasks) ends with the generation
                "state.paused": False,
                "state.stop": None,
                # a fresh generation starts from scratch
                "state.checkpoint": None,
                "state.progress": None,
                # the deadline the operator gave, else the old one unless already past (it would
                # expire the new generation at once)
                "option.deadline": literal(params.deadline)
                if params.deadline is not None
                else {"$cond": [{"$lte": ["$option.deadline", now]}, None, "$option.deadline"]},
            }
        else:
            raise InvalidInput(f"unknown control action {params.action!r}")
        pipeline = [*stages, {"$set": change}, *derive_stages(params.now)]
        return await self._control_write(params, filter_, pipeline)

    async def _control_write(
        self, params: ControlParams, filter_: dict[str, Any], pipeline: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The control's findAndModify; a lost reply is answered from the task when it holds
        this write's time and change (``_applied``)."""

        async def update() -> Any:
            return await self.tasks.find_one_and_update(
                filter_, pipeline, return_document=ReturnDocument.AFTER
            )

        async def recover() -> dict[str, Any] | None:
            one = one_task(params.key, filter_["part"])
            doc: dict[str, Any] | None = await self.tasks_primary.find_one(one)
            return doc if doc is not None and _applied(params, from_mongo(doc)) else None

        try:
            result = await self._call(f"{params.action} task", update, recover=recover)
        except DuplicateKeyError as exc:  # the unique index unique_live: a restart's params are taken
            raise UniqueParamsTaken(params.key, await self._unique_holder_of(params.key)) from exc
        return _without_id(result)

    async def _remove_task(self, params: ControlParams, filter_: dict[str, Any]) -> dict[str, Any] | None:
        """Delete the task while its status allows; the task as it was deleted. Read first, so
        that a delete whose reply was lost (gone when looked for) still answers it."""
        one = one_task(params.key, filter_["part"])
        before: dict[str, Any] | None = await self._call(
            "read task", lambda: self.tasks_primary.find_one(one)
        )
        if before is None:
            return None

        async def recover() -> dict[str, Any] | None:
            gone = await self.tasks_primary.find_one(one, {"_id": 1}) is None
            return before if gone else None

        deleted = await self._call(
            "remove task", lambda: self.tasks.find_one_and_delete(filter_), recover=recover
        )
        return _without_id(deleted)

    async def _unique_holder_of(self, key: str) -> str | None:
        """The key of the live task holding the params hash of task ``key`` (None: none now)."""

        async def read() -> str | None:
            doc = await self.tasks.find_one({"key": key, "part": self._part(key)}, {"unique_hash": 1})
            if doc is None or not doc.get("unique_hash"):
                return None
            holder = await self.tasks_primary.find_one(
                {"state.unique_live": live_hash(doc["unique_hash"])}, {"key": 1}
            )
            return str(holder["key"]) if holder is not None else None

        return await self._call("find the holder of a params hash", read)


def _applied(params: ControlParams, doc: dict[str, Any]) -> bool:
    """Does the task hold the control ``params`` wrote (its time, and the action's change)?"""
    state = doc.get("state", {})
    if state.get("update_time") != params.now:
        return False
    if params.action == "cancel":
        return (state.get("cancelled") or {}).get("time") == params.now
    if params.action == "restart":
        history = state.get("history") or [{}]
        return bool(history[-1].get("restart_time") == params.now)
    return state.get("paused") is (params.action == "pause")


def _without_id(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """A task document as the domain sees it (no ``_id``, no ``wake``), or None."""
    if doc is None:
        return None
    doc.pop("_id", None)
    doc.pop(WAKE, None)
    return from_mongo(doc)  # type: ignore[no-any-return]
