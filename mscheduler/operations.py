"""Domain operations for operators: the one API that Python code, the CLI, the REST API and the
dashboard call to look at and steer the scheduler. No rule and no query is written twice: each
operation validates its input, takes the time from the server-corrected clock, and calls one
named driver operation.

Today: workers (list, remote stop) and tasks (get, list, count). Task control (pause, cancel,
restart, ...) and plans join here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mscheduler.clock import Clock, ServerClock
from mscheduler.drivers.base import Driver, ListParams
from mscheduler.exceptions import InvalidInput, UnknownTask
from mscheduler.model import TaskInfo, TaskStatus, validate_key, validate_name

LIST_LIMIT_MAX = 1000
# A worker whose last heartbeat is older than this is reported as not live.
WORKER_LIVENESS = timedelta(seconds=30)


@dataclass(slots=True, frozen=True)
class WorkerView:
    """A registered consumer as an operator sees it."""

    worker_id: str
    host: str
    pid: int
    names: tuple[str, ...]
    concurrency: int
    start_time: datetime
    last_seen: datetime
    running_cnt: int
    stop_requested: bool
    stop_time: datetime | None
    live: bool  # running, with a recent heartbeat


class Operations:
    """Operator operations over one store.

    :param driver: the storage.
    :param clock: time source; by default the system clock corrected to the server's clock (the
        same correction consumers use, so a stop request is stamped in the server's time).
    """

    def __init__(self, driver: Driver, *, clock: Clock | None = None) -> None:
        self.driver = driver
        self.clock = clock if isinstance(clock, ServerClock) else ServerClock(clock)
        self._synced = False

    async def _now(self) -> datetime:
        if not self._synced:
            await self.clock.sync(self.driver.server_time)
            self._synced = True
        return self.clock.now()

    # -- workers ------------------------------------------------------------------------------

    async def list_workers(self) -> list[WorkerView]:
        """Every registered consumer, oldest first, with whether it is live."""
        now = await self._now()
        views = []
        for w in await self.driver.list_workers():
            stop_time = w.get("stop_time")
            views.append(
                WorkerView(
                    worker_id=w["worker_id"],
                    host=w["host"],
                    pid=w["pid"],
                    names=tuple(w["names"]),
                    concurrency=w["concurrency"],
                    start_time=w["start_time"],
                    last_seen=w["last_seen"],
                    running_cnt=w["running_cnt"],
                    stop_requested=bool(w.get("stop_requested")),
                    stop_time=stop_time,
                    live=stop_time is None and w["last_seen"] >= now - WORKER_LIVENESS,
                )
            )
        return sorted(views, key=lambda v: (v.start_time, v.worker_id))

    async def request_worker_stop(self, worker_id: str) -> bool:
        """Ask a running consumer to stop gracefully (it sees the request at its next heartbeat).
        False if no running consumer has that id (unknown, or stopped already)."""
        if not isinstance(worker_id, str) or not worker_id or worker_id.startswith("$"):
            raise InvalidInput(f"invalid worker id {worker_id!r}")
        return await self.driver.request_worker_stop(worker_id, await self._now())

    # -- tasks --------------------------------------------------------------------------------

    async def get_task(self, key: str) -> TaskInfo:
        """The task as stored; raises ``UnknownTask``."""
        doc = await self.driver.get_task(_checked(validate_key, key, "key"))
        if doc is None:
            raise UnknownTask(key)
        return TaskInfo.from_storage(doc)

    async def list_tasks(
        self, *, status: str | None = None, name: str | None = None, limit: int = 100, skip: int = 0
    ) -> list[TaskInfo]:
        """Tasks oldest first, filtered by status and / or name (each served by an index)."""
        if status is not None:
            try:
                status = TaskStatus(status).value
            except ValueError:
                choices = ", ".join(s.value for s in TaskStatus)
                raise InvalidInput(f"status: unknown status {status!r} (one of {choices})") from None
        if name is not None:
            name = _checked(validate_name, name, "name")
        if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT_MAX:
            raise InvalidInput(f"limit: must be an integer from 1 to {LIST_LIMIT_MAX}")
        if not isinstance(skip, int) or skip < 0:
            raise InvalidInput("skip: must be a non-negative integer")
        docs = await self.driver.list_tasks(ListParams(status=status, name=name, limit=limit, skip=skip))
        return [TaskInfo.from_storage(doc) for doc in docs]

    async def count_by_status(self) -> dict[str, int]:
        """How many tasks are in each status (statuses with none are 0)."""
        counts = await self.driver.count_by_status()
        return {s.value: counts.get(s.value, 0) for s in TaskStatus}


def _checked(validate: Any, value: object, field: str) -> Any:
    try:
        return validate(value)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from exc
