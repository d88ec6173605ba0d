"""The expiry pass as a service: attempts whose lease ran out become ``lost`` (their task may be
claimed again, within its retry budget) and tasks past their deadline become ``expired``.

Every consumer's discovery runs the same two store operations on each poll, so a store with
running consumers needs nothing more. ``ExpiryService`` is for the other times — every consumer
stopped, or only remote executors and operators — run by ``mscheduler maintenance`` (or
yourself: ``await ExpiryService(driver).run_once()``). Any number may run at once: both writes
are compare-and-sets on the store's own times.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from mscheduler.domain.clock import Clock, SystemClock
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.schedule import utc_ms
from mscheduler.drivers.base import Driver, ExpireParams
from mscheduler.services.base import PeriodicService

log = logging.getLogger("mscheduler.expiry")

DEFAULT_INTERVAL = 5.0


class ExpiryService(PeriodicService):
    """Marks expired leases lost and tasks past their deadline expired.

    :param driver: the storage.
    :param clock: time source (the CLI passes a server-corrected clock; tests a FakeClock).
    :param interval: seconds between passes of ``run``.
    """

    what = "expiry"

    def __init__(
        self, driver: Driver, *, clock: Clock | None = None, interval: float = DEFAULT_INTERVAL
    ) -> None:
        if not 0 < interval <= 3600:
            raise InvalidInput("interval: must be more than 0 and at most 3600 seconds")
        self.driver = driver
        self.clock: Clock = clock or SystemClock()
        self.interval = interval
        self.leases_lost = 0  # attempts this service marked lost
        self.deadlines_expired = 0  # tasks this service expired
        self.passes = 0
        self._stopping = asyncio.Event()

    async def run_once(self, now: datetime | None = None) -> int:
        """One pass at ``now`` (default: the clock's); returns how many attempts and tasks it
        changed."""
        params = ExpireParams(utc_ms(now if now is not None else self.clock.now()))
        leases = await self.driver.expire_leases(params)
        deadlines = await self.driver.expire_deadlines(params)
        self.passes += 1
        self.leases_lost += leases
        self.deadlines_expired += deadlines
        if leases or deadlines:
            log.info(
                "expiry: %d lease(s) lost, %d task(s) past their deadline",
                leases,
                deadlines,
                extra={"leases_lost": leases, "deadlines_expired": deadlines},
            )
        return leases + deadlines
