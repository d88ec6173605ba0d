"""The loop of a background service (planner, retention): ``run_once`` every ``interval`` seconds
until ``stop``, surviving storage trouble. Tests call ``run_once`` directly; a consumer or a CLI
command runs ``run`` as a supervised side task."""

from __future__ import annotations

import asyncio
import logging

from mscheduler.domain.clock import Clock, sleep_unless
from mscheduler.domain.exceptions import MSchedulerError, StorageError

log = logging.getLogger("mscheduler.service")


class PeriodicService:
    """Subclasses set ``what`` (a name for logs), ``interval``, ``clock``, ``passes`` (counted by
    their ``run_once``) and ``_stopping`` (an ``asyncio.Event``) and define ``run_once``."""

    what = "service"
    interval: float
    clock: Clock
    passes: int
    _stopping: asyncio.Event

    async def run_once(self) -> int:
        raise NotImplementedError

    async def run(self) -> None:
        """Pass every ``interval`` seconds until ``stop``; storage errors are logged and retried
        at the next pass, except configuration errors (raised: retrying cannot help)."""
        while not self._stopping.is_set():
            try:
                await self.run_once()
            except StorageError as exc:
                if exc.config:
                    raise
                log.warning("%s pass failed (%s); trying again in %.1fs", self.what, exc, self.interval)
            except MSchedulerError as exc:
                log.error("%s pass failed (%s); trying again in %.1fs", self.what, exc, self.interval)
            await self._sleep(self.interval)

    async def _sleep(self, seconds: float) -> None:
        await sleep_unless(self.clock, seconds, self._stopping)

    def stop(self) -> None:
        """Ask ``run`` to return after the current pass (idempotent)."""
        self._stopping.set()
