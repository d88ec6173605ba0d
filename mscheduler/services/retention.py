"""Retention of finished tasks: a small maintenance service.

Finished tasks (succeeded, failed, cancelled, expired) are removed once they have been finished
longer than their status's retention period, counted from ``state.finish_time`` (set by the
write that made the task terminal; a restart clears it).

* On a real MongoDB server the store does it itself: ``ensure_retention`` keeps one TTL index per
  status on ``state.finish_time`` (partial on the status), changed with ``collMod`` when a period
  changes; the TTL monitor deletes about once a minute.
* ``RetentionService.run_once`` deletes what is due, in bounded batches (one read of the oldest
  keys through the ``finished`` index and one delete per batch), handing the event loop back
  between batches: a pass that finds a backlog never stalls the consumers on the same loop.
  On a real server a backstop for tasks of no family and the mechanism for families (child
  tasks); with the memory driver and on mongomock (no TTL monitor) the mechanism.

Run it as a consumer's side task (``Consumer(retention=Retention(...))``) or yourself
(``await RetentionService(driver).run_once()``). Any
number may run at once: a delete is idempotent. Periods are per store: give every consumer the
same ``Retention`` (the last one to start sets the TTL indexes).

A recurring plan whose last run was removed before a planner saw its outcome records it as
``missing`` and carries on (see ``mscheduler.services.planner.decide``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, fields
from datetime import datetime, timedelta

from mscheduler.domain.clock import Clock, SystemClock
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.schedule import utc_ms
from mscheduler.drivers.base import Driver, PurgeParams, RetentionParams
from mscheduler.services.base import PeriodicService

log = logging.getLogger("mscheduler.retention")

DEFAULT_BATCH = 1000
DEFAULT_INTERVAL = 60.0
MAX_ROUNDS = 100  # batches per status per pass (a full batch means more may be due)
MAX_PERIOD = timedelta(days=3650)


@dataclass(slots=True, frozen=True)
class Retention:
    """How long finished tasks are kept, per status; ``None`` keeps them for ever.

    Defaults: a week for succeeded tasks, 30 days for failed, cancelled and expired ones (kept
    longer: someone may want to look at why).
    """

    succeeded: timedelta | None = timedelta(days=7)
    failed: timedelta | None = timedelta(days=30)
    cancelled: timedelta | None = timedelta(days=30)
    expired: timedelta | None = timedelta(days=30)

    def __post_init__(self) -> None:
        for f in fields(self):
            period = getattr(self, f.name)
            if period is None:
                continue
            if not isinstance(period, timedelta) or not timedelta(seconds=1) <= period <= MAX_PERIOD:
                raise InvalidInput(f"retention {f.name}: a timedelta from 1 second to 3650 days, or None")

    def periods(self) -> dict[str, timedelta | None]:
        """Status -> period (whole seconds: what a TTL index can hold)."""
        return {
            f.name: None
            if (p := getattr(self, f.name)) is None
            else timedelta(seconds=int(p.total_seconds()))
            for f in fields(self)
        }


class RetentionService(PeriodicService):
    """Removes finished tasks past their retention; run any number of them at once.

    :param driver: the storage.
    :param retention: the periods (``Retention()``: the defaults).
    :param clock: time source (a consumer passes its server-corrected clock; tests a FakeClock).
    :param batch: tasks removed per command (one read and one delete each).
    :param interval: seconds between passes of ``run``.
    """

    what = "retention"

    def __init__(
        self,
        driver: Driver,
        retention: Retention | None = None,
        *,
        clock: Clock | None = None,
        batch: int = DEFAULT_BATCH,
        interval: float = DEFAULT_INTERVAL,
        max_rounds: int = MAX_ROUNDS,
    ) -> None:
        retention = Retention() if retention is None else retention
        if not isinstance(retention, Retention):
            raise InvalidInput(f"retention: a Retention, got {type(retention).__name__}")
        if not isinstance(batch, int) or not 1 <= batch <= 10_000:
            raise InvalidInput("batch: must be an integer from 1 to 10,000")
        if not 0 < interval <= 86_400:
            raise InvalidInput("interval: must be more than 0 and at most 86,400 seconds")
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise InvalidInput("max_rounds: must be a positive integer")
        self.driver = driver
        self.retention = retention
        self.clock: Clock = clock or SystemClock()
        self.batch = batch
        self.interval = interval
        self.max_rounds = max_rounds
        self.ttl: bool | None = None  # the store expires tasks by itself (TTL indexes); None: not asked yet
        self.removed = 0  # tasks this service removed
        self.passes = 0
        self._stopping = asyncio.Event()

    async def run_once(self, now: datetime | None = None) -> int:
        """Remove the finished tasks past their period at ``now`` (default: the clock's); returns
        how many. The first pass also sets up the store's own expiry (TTL indexes)."""
        now = utc_ms(now if now is not None else self.clock.now())
        periods = self.retention.periods()
        if self.ttl is None:
            self.ttl = await self.driver.ensure_retention(RetentionParams(periods))
        removed = 0
        for status, period in periods.items():
            if period is None:
                continue
            params = PurgeParams(status, now - period, self.batch)
            for _ in range(self.max_rounds):
                n = await self.driver.purge_finished(params)
                removed += n
                if n < self.batch:
                    break
                await asyncio.sleep(0)  # the in-memory store removes a batch without awaiting
        self.passes += 1
        self.removed += removed
        if removed:
            log.info("retention: removed %d finished task(s)", removed, extra={"removed": removed})
        return removed
