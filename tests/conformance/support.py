"""Short spellings of the Driver operations for the conformance suite.

``Store`` wraps one driver and one ``FakeClock``: every operation is called with an explicit
``now`` from the clock, and after every write the stored derived fields of every task are
checked against ``tests/oracle.py``, a plain statement of the design's table written apart from
``mscheduler.domain.state.derive`` (which the memory driver itself calls): a driver whose update
pipelines drift from the table fails whichever test made it drift, and so does the memory driver.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from mscheduler.domain.listing import ListParams
from mscheduler.domain.model import TaskOption, check_params
from mscheduler.domain.state import DERIVED_FIELDS, LIVE, TERMINAL
from mscheduler.drivers.base import (
    ClaimedTask,
    ClaimParams,
    Driver,
    ExpireParams,
    FinishParams,
    InsertParams,
    NewTask,
    PingParams,
    PingResult,
    UpdateOptionParams,
)
from mscheduler.testing.clock import FakeClock
from tests.oracle import expected_derived

NAME = "job"
LEASE = timedelta(seconds=30)


def stored_option(now: datetime, **option: Any) -> dict[str, Any]:
    """A TaskOption in storage form (what the Publisher hands to the driver)."""
    return TaskOption(**option).to_storage(now)


def derived_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {field: doc["state"][field] for field in DERIVED_FIELDS}


def assert_derived(doc: Mapping[str, Any]) -> None:
    """The stored derived fields equal the design's table (``tests.oracle.expected_derived``)."""
    expected = expected_derived(doc)
    stored = derived_of(doc)
    drift = [
        f"{f}: stored {stored[f]!r}, expected {expected[f]!r}" for f in expected if stored[f] != expected[f]
    ]
    assert not drift, f"derived state drifted for {doc['key']!r}: {', '.join(drift)}"
    # the lifecycle fields (mscheduler.domain.state.lifecycle): finish time iff terminal (and, for a
    # parent, no child is live any more), the params hash held iff live
    state = doc["state"]
    children_live = any(c["status"] in LIVE for c in state.get("children") or ())
    finished = state["status"] in TERMINAL and not children_live
    assert (state.get("finish_time") is not None) == finished, doc["key"]
    live = state["status"] in LIVE
    assert state.get("unique_live") == (doc.get("unique_hash") if live else None), doc["key"]


def naive_datetimes(value: Any, path: str = "") -> list[str]:
    """Paths of datetimes in ``value`` that are not timezone-aware UTC."""
    if isinstance(value, datetime):
        return [] if value.tzinfo is not None and value.utcoffset() == timedelta(0) else [path or "."]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in naive_datetimes(v, f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in naive_datetimes(v, f"{path}[{i}]")]
    if hasattr(value, "__dataclass_fields__"):
        return [
            p for f in value.__dataclass_fields__ for p in naive_datetimes(getattr(value, f), f"{path}.{f}")
        ]
    return []


class Store:
    """One driver and one fake clock; tokens are deterministic (``<worker>#<n>``)."""

    def __init__(self, driver: Driver, clock: FakeClock, *, check: bool = True) -> None:
        self.driver = driver
        self.clock = clock
        self.check = check
        self._tokens = itertools.count(1)

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def advance(self, seconds: float) -> None:
        self.clock.advance(timedelta(seconds=seconds))

    def at(self, seconds: float) -> datetime:
        """The time ``seconds`` from now."""
        return self.now + timedelta(seconds=seconds)

    def task(self, key: str, name: str = NAME, params: Any = None, **option: Any) -> NewTask:
        # params validated as Task does it (the Publisher only hands validated params over).
        # retry_delay 0 unless a test says otherwise: a lost lease is then claimable at once (lost
        # leases wait the retry policy's delay, like failures; tests of that set it).
        option.setdefault("retry_delay", timedelta(0))
        return NewTask(key, name, check_params(params), stored_option(self.now, **option))

    def token(self, worker: str) -> str:
        return f"{worker}#{next(self._tokens)}"

    # -- operations -------------------------------------------------------------------------------

    async def insert(self, *tasks: NewTask, reset_finished: bool = False) -> list[bool]:
        created = await self.driver.insert_tasks(InsertParams(list(tasks), self.now, reset_finished))
        await self.check_all()
        return created

    async def add(self, key: str, name: str = NAME, params: Any = None, **option: Any) -> bool:
        return (await self.insert(self.task(key, name, params, **option)))[0]

    async def claim(
        self,
        worker: str,
        n: int = 1,
        names: Iterable[str] = (NAME,),
        lease: timedelta = LEASE,
        host: str | None = None,
        pid: int | None = None,
        exclude_keys: Iterable[str] = (),
        groups: Iterable[str] = (),
        lanes: Iterable[str | None] = (None,),
        exhausted: list[str | None] | None = None,
    ) -> list[ClaimedTask]:
        params = ClaimParams(
            worker_id=worker,
            names=list(names),
            now=self.now,
            attempts=[self.token(worker) for _ in range(n)],
            max_lease=lease,
            host=host,
            pid=pid,
            exclude_keys=list(exclude_keys),
            groups=list(groups),
            lanes=list(lanes),
            exhausted=exhausted,
        )
        claimed = await self.driver.claim(params)
        assert len(claimed) <= n
        await self.check_all()
        return claimed

    async def claim_one(self, worker: str, **kwargs: Any) -> ClaimedTask | None:
        claimed = await self.claim(worker, 1, **kwargs)
        return claimed[0] if claimed else None

    async def claim_keys(self, worker: str, n: int = 1, **kwargs: Any) -> list[str]:
        return [c.key for c in await self.claim(worker, n, **kwargs)]

    async def ping(
        self, worker: str, attempts: Mapping[str, str], lease: timedelta = LEASE, groups: Iterable[str] = ()
    ) -> PingResult:
        expires = {self.now + lease: dict(attempts)}
        result = await self.driver.ping(PingParams(worker, self.now, expires, worker_groups=list(groups)))
        await self.check_all()
        return result

    async def finish(
        self,
        key: str,
        worker: str,
        attempt: str,
        outcome: str = "succeeded",
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        retry_in: float | None = None,
    ) -> bool:
        retry_at = self.at(retry_in) if retry_in is not None else None
        item = FinishParams(key, worker, attempt, self.now, outcome, result, error, retry_at)
        (accepted,) = await self.driver.finish([item])
        await self.check_all()
        return accepted

    async def done(self, claimed: ClaimedTask, worker: str, result: Any = None) -> bool:
        return await self.finish(claimed.key, worker, claimed.attempt, result=result)

    async def fail(self, claimed: ClaimedTask, worker: str, retry_in: float = 10.0) -> bool:
        error = {"type": "RuntimeError", "message": "boom", "traceback": None}
        return await self.finish(
            claimed.key, worker, claimed.attempt, "failed", error=error, retry_in=retry_in
        )

    async def expire(self) -> int:
        expired = await self.driver.expire_leases(ExpireParams(self.now))
        await self.check_all()
        return expired

    async def update_option(self, key: str, option: dict[str, Any]) -> bool:
        updated = await self.driver.update_option(UpdateOptionParams(key, option, self.now))
        await self.check_all()
        return updated

    async def change_option(self, key: str, **changes: Any) -> dict[str, Any]:
        """Change some fields of a task's stored option; returns the new stored option."""
        doc = await self.get(key)
        option = dict(doc["option"]) | changes
        assert await self.update_option(key, option)
        return option

    # -- reading ----------------------------------------------------------------------------------

    async def get(self, key: str) -> dict[str, Any]:
        doc = await self.driver.get_task(key)
        assert doc is not None, f"no task {key!r}"
        assert_derived(doc)
        return doc

    async def state(self, key: str) -> dict[str, Any]:
        return dict((await self.get(key))["state"])

    async def status(self, key: str) -> str:
        return str((await self.state(key))["status"])

    async def entries(self, key: str) -> list[dict[str, Any]]:
        return list((await self.state(key))["worker_states"])

    async def entry(self, key: str, attempt: str) -> dict[str, Any]:
        return next(e for e in await self.entries(key) if e["attempt"] == attempt)

    async def all_tasks(self) -> list[dict[str, Any]]:
        return await self.driver.list_tasks(ListParams(limit=1000))

    async def check_all(self) -> None:
        if self.check:
            for doc in await self.all_tasks():
                assert_derived(doc)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc, arg-type]
