"""The memory driver's flow limits: a dict of limit documents by key and a dict of which
limit covers each name (the Mongo unique index ``limits_names``'s twin). The rules are
``mscheduler.domain.limits.grant`` / ``settle``, the same the Mongo driver writes as pipelines; no
operation awaits inside, so each is atomic on the event loop.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from mscheduler.domain.limits import acquire_result_fields, grant, granted_of, held_in, settle
from mscheduler.drivers.base import (
    AcquireParams,
    AcquireResult,
    LimitNameTaken,
    LimitOfName,
    PutLimitParams,
    SlotsParams,
)


class MemoryLimits:
    """Limit operations of ``MemoryDriver`` (a mixin)."""

    _limits: dict[str, dict[str, Any]]
    _limit_of_name: dict[str, str]

    def _init_limits(self) -> None:
        self._limits = {}
        self._limit_of_name = {}

    async def put_limit(self, params: PutLimitParams) -> bool:
        names = list(params.fields["names"])
        for name in names:
            holder = self._limit_of_name.get(name)
            if holder is not None and holder != params.key:
                raise LimitNameTaken(params.key, name, holder)
        doc = self._limits.get(params.key)
        created = doc is None
        if doc is None:
            doc = {"_id": params.key, "slots": {}, "starts": {}, "create_time": params.now}
            self._limits[params.key] = doc
        for name in doc.get("names", []):
            self._limit_of_name.pop(name, None)
        doc.update(copy.deepcopy(dict(params.fields)), update_time=params.now)
        for name in names:
            self._limit_of_name[name] = params.key
        return created

    async def get_limit(self, key: str) -> dict[str, Any] | None:
        doc = self._limits.get(key)
        return copy.deepcopy(doc) if doc is not None else None

    async def list_limits(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(self._limits[k]) for k in sorted(self._limits)]

    async def delete_limit(self, key: str) -> bool:
        doc = self._limits.pop(key, None)
        if doc is None:
            return False
        for name in doc["names"]:
            self._limit_of_name.pop(name, None)
        return True

    async def limit_keys(self, names: Sequence[str]) -> dict[str, LimitOfName]:
        found = {n: self._limit_of_name[n] for n in names if n in self._limit_of_name}
        return {n: LimitOfName(key, self._limits[key].get("rate_n") is not None) for n, key in found.items()}

    async def held_slots(self, worker_id: str, attempts: Sequence[str], now: datetime) -> dict[str, str]:
        return held_in(self._limits.values(), worker_id, attempts, now)

    async def acquire_slots(self, params: AcquireParams) -> AcquireResult:
        doc = self._limits.get(params.key)
        if doc is None:
            return AcquireResult(granted=list(params.attempts), limited=False)
        grant(doc, params.worker_id, params.attempts, params.now, params.expire, params.release)
        granted = granted_of(doc, params.worker_id, params.attempts, params.now)
        return AcquireResult(granted=granted, **acquire_result_fields(doc, params.now))

    async def update_slots(self, params: SlotsParams) -> list[str]:
        doc = self._limits.get(params.key)
        if doc is None:
            return list(params.extend)
        return settle(doc, params.worker_id, params.now, params.extend, params.release, params.unused)
