"""Clocks for tests: ``FakeClock`` moves only when told; ``SkewedClock`` is another clock set wrong.

Both implement ``mscheduler.domain.clock.Clock``, the seam all time goes through.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta

from mscheduler.domain.clock import Clock, truncate_ms


class FakeClock:
    """A clock that moves only when told; sleepers wake when time passes their deadline."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = truncate_ms(start or datetime(2030, 1, 1, tzinfo=UTC))
        self._mono = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), future))
        await future

    def advance(self, delta: timedelta | float) -> None:
        seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
        if seconds < 0:
            raise ValueError("a fake clock does not go back; use skew for wall-clock jumps")
        self._mono += seconds
        self._now = truncate_ms(self._now + timedelta(seconds=seconds))
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def next_deadline(self) -> float | None:
        """When (``monotonic()`` time) the earliest sleeper wakes; None if nothing sleeps."""
        while self._sleepers and self._sleepers[0][2].done():  # given up on (cancelled)
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    def skew(self, delta: timedelta) -> None:
        """Jump the wall clock only (as a badly set machine clock would); monotonic time stays."""
        self._now = truncate_ms(self._now + delta)


class SkewedClock:
    """Another clock's time shifted by a fixed skew (a worker whose clock is wrong)."""

    def __init__(self, base: Clock, skew: timedelta) -> None:
        self.base = base
        self.skew = skew

    def now(self) -> datetime:
        return truncate_ms(self.base.now() + self.skew)

    def monotonic(self) -> float:
        return self.base.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)
