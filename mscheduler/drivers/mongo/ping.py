"""The ping of ``MongoDriver``: lease renewal for all of a worker's running attempts, with the
handlers' checkpoints and progress riding along.

Without reports a ping is one ``update_many`` per lease length (usually one) plus one read from
the primary. With reports (some handlers called ``ctx.checkpoint`` / ``ctx.progress`` since the
last ping) it is still one write command: a ``bulk_write`` holding one ``UpdateMany`` for the
attempts without reports and one ``UpdateOne`` per attempt with one, each fenced exactly like the
plain ping (this worker, this attempt, running, unexpired, still allowed, task not cancelled), so
a worker that lost its lease can never overwrite the checkpoint of the attempt that took over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pymongo import UpdateMany, UpdateOne

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.partitions import by_part
from mscheduler.domain.state import stopped_by_pause
from mscheduler.drivers.base import (
    AttemptReport,
    PingParams,
    PingResult,
    allowed,
    paused_entry,
    report_fields,
)
from mscheduler.drivers.mongo.common import (
    KEY_INDEX,
    WORKER_STATES,
    T,
    from_mongo_in_place,
    literal,
    rebuild_entries,
    to_mongo,
    write_concern_only,
)


class MongoPing:
    """``ping`` of ``MongoDriver`` (a mixin: it uses ``_call``, ``tasks``, ``tasks_primary``)."""

    tasks: Any
    tasks_primary: Any

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

    @staticmethod
    def _ping_filter(
        worker_id: str, now: datetime, attempts: Mapping[str, str], groups: Sequence[str] = (), part: int = 0
    ) -> dict[str, Any]:
        # still allowed: no workers or groups named, this worker named, or one of
        # its groups named
        anyone = {
            "$and": [
                {"option.specific_worker_ids": {"$size": 0}},
                {
                    "$or": [
                        {"option.specific_groups": {"$exists": False}},
                        {"option.specific_groups": {"$size": 0}},
                    ]
                },
            ]
        }
        allowed_now: list[dict[str, Any]] = [anyone, {"option.specific_worker_ids": worker_id}]
        if groups:
            allowed_now.append({"option.specific_groups": {"$in": list(groups)}})
        keys = list(attempts)
        return {
            "key": {"$in": keys},
            # one partition: a sharded cluster's one shard; a report's write is about one task,
            # a single-document update: its _id too (the whole shard key, see one_task)
            **({"_id": keys[0]} if len(keys) == 1 else {}),
            "part": part,
            WORKER_STATES: {
                "$elemMatch": {
                    "worker_id": worker_id,
                    "attempt": {"$in": list(attempts.values())},
                    "status": "running",
                    "ping_expire_time": {"$gt": now},
                }
            },
            "$or": allowed_now,
            "state.cancelled": None,  # a cancelled task's leases are not extended
            # nor those of attempts a stopping pause listed (settled released by their workers)
            "state.stop.attempts": {"$nin": list(attempts.values())},
        }

    @staticmethod
    def _ping_update(
        worker_id: str, now: datetime, attempts: Mapping[str, str], expire: datetime
    ) -> list[dict[str, Any]]:
        # A $map, not the positional "$": when a filter matches two arrays (here also
        # specific_worker_ids) "$" may resolve to the other array's index (SERVER-5247).
        tokens = list(attempts.values())
        if any(t.startswith("$") for t in tokens):
            raise StorageError("attempt tokens must not start with '$'")
        match = {
            "$and": [
                {"$eq": ["$$e.worker_id", literal(worker_id)]},
                {"$in": ["$$e.attempt", tokens]},
                {"$eq": ["$$e.status", "running"]},
                {"$gt": ["$$e.ping_expire_time", literal(now)]},
            ]
        }
        return [rebuild_entries(match, {"ping_expire_time": expire})]

    async def ping(self, params: PingParams) -> PingResult:
        """The renewal of every attempt of ``params``: one write per partition its tasks are in
        (per lease length; one write, unpartitioned), then one read."""
        if self.partitions == 1:
            return await self._ping_part(params, 0)
        keys = [key for group in params.groups.values() for key in group]
        result = PingResult()
        for part, of_part in by_part(keys, self.partitions).items():
            wanted = set(of_part)
            groups = {
                expire: {k: a for k, a in group.items() if k in wanted}
                for expire, group in params.groups.items()
                if wanted.intersection(group)
            }
            reports = {k: r for k, r in params.reports.items() if k in wanted}
            one = await self._ping_part(replace(params, groups=groups, reports=reports), part)
            result.alive |= one.alive
            for name in ("lost", "revoked", "cancelled", "paused", "recorded"):
                getattr(result, name).extend(getattr(one, name))
        return result

    async def _ping_part(self, params: PingParams, part: int) -> PingResult:
        now = to_mongo(params.now)
        every_key: dict[str, str] = {}
        writes: list[Callable[[], Awaitable[Any]]] = []
        bulk: list[Any] = []
        hint: dict[str, Any] = {"hint": KEY_INDEX}
        for expire, attempts in params.groups.items():
            every_key.update(attempts)
            plain = {k: a for k, a in attempts.items() if k not in params.reports}
            if not params.reports:
                filter_ = self._ping_filter(params.worker_id, now, plain, params.worker_groups, part)
                update = self._ping_update(params.worker_id, now, plain, expire)

                async def ping_group(
                    filter_: dict[str, Any] = filter_, update: list[dict[str, Any]] = update
                ) -> Any:
                    return await self.tasks.update_many(filter_, update, **hint)

                writes.append(ping_group)
                continue
            if plain:
                filter_ = self._ping_filter(params.worker_id, now, plain, params.worker_groups, part)
                bulk.append(
                    UpdateMany(filter_, self._ping_update(params.worker_id, now, plain, expire), **hint)
                )
            for key, attempt in attempts.items():
                report = params.reports.get(key)
                if report is None:
                    continue
                one = {key: attempt}
                fields = report_fields(report, params.worker_id, attempt, params.now)
                # user data (the checkpoint) enters the pipeline only inside $literal
                record = {"$set": {f"state.{name}": literal(value) for name, value in fields.items()}}
                update = [*self._ping_update(params.worker_id, now, one, expire), record]
                bulk.append(
                    UpdateOne(
                        self._ping_filter(params.worker_id, now, one, params.worker_groups, part),
                        update,
                        **hint,
                    )
                )
        if bulk:

            async def ping_bulk() -> Any:
                return await self.tasks.bulk_write(bulk, ordered=False)

            writes.append(ping_bulk)
        for write in writes:
            try:
                await self._call("ping", write)
            except StorageError as exc:
                if not write_concern_only(exc.__cause__) or exc.config:
                    raise
                # applied on the primary, not yet on a majority (a plain write's 64, or a bulk
                # write's 65 holding write-concern errors only): the read below tells

        projection = {"key": 1, "option": 1, WORKER_STATES: 1, "state.cancelled": 1, "state.stop": 1}
        if params.reports:
            for name in ("checkpoint", "progress"):
                projection |= {f"state.{name}.attempt": 1, f"state.{name}.seq": 1}

        async def read() -> list[dict[str, Any]]:
            cursor = self.tasks_primary.find(
                {"key": {"$in": list(every_key)}, "part": part},
                # The whole array: MongoDB refuses an $elemMatch projection on a nested field
                # (error 31275); the entry is picked below.
                projection,
            )
            return [from_mongo_in_place(doc) async for doc in cursor]

        docs = {doc["key"]: doc for doc in await self._call("ping read", read)}
        return _ping_result(params, every_key, docs)


def _ping_result(params: PingParams, every_key: dict[str, str], docs: dict[str, Any]) -> PingResult:
    """What the read after a ping says about each attempt (see ``PingResult``)."""
    expires = {key: expire for expire, group in params.groups.items() for key in group}
    result = PingResult()
    for key, attempt in every_key.items():
        doc = docs.get(key)
        entries = (doc or {}).get("state", {}).get("worker_states", [])
        entry = next(
            (
                e
                for e in entries
                if e["worker_id"] == params.worker_id and e["attempt"] == attempt and e["status"] == "running"
            ),
            None,
        )
        if doc is None or entry is None:
            (result.paused if paused_entry(doc, params.worker_id, attempt) else result.lost).append(key)
        elif doc["state"].get("cancelled") is not None and entry["ping_expire_time"] > params.now:
            result.cancelled.append(key)
        elif stopped_by_pause(doc["state"], attempt) and entry["ping_expire_time"] > params.now:
            result.paused.append(key)  # not renewed: its worker settles it released
        elif entry["ping_expire_time"] == expires[key] and allowed(
            doc["option"], params.worker_id, params.worker_groups
        ):
            # extended (or already at the asked expiry: a ping in the same millisecond as
            # the claim); a revoked entry is never extended, whatever its expiry says
            result.alive[key] = doc["option"]
        elif entry["ping_expire_time"] <= params.now:
            result.lost.append(key)
        elif not allowed(doc["option"], params.worker_id, params.worker_groups):
            result.revoked.append(key)
        else:
            # Still ours and unexpired but not extended: a concurrent change; try next time.
            result.alive[key] = doc["option"]
        report = params.reports.get(key)
        if key in result.alive and report is not None and _landed(doc, attempt, report):
            result.recorded.append(key)
    return result


def _landed(doc: Mapping[str, Any] | None, attempt: str, report: AttemptReport) -> bool:
    """The stored checkpoint (or progress) is the one this report wrote: its attempt and seq."""
    stored = (doc or {}).get("state", {}).get("checkpoint" if report.save_checkpoint else "progress")
    return (
        isinstance(stored, Mapping) and stored.get("attempt") == attempt and stored.get("seq") == report.seq
    )
