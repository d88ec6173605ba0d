"""All time goes through one seam.

Lease times are computed against the database server's clock: ``ServerClock`` adds an offset
estimated from the server's own time (``hello``'s ``localTime``), so workers whose clocks disagree
still agree on when a lease ends. Tests use ``FakeClock`` and move time explicitly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from mscheduler.domain.exceptions import InvalidInput


async def sleep_unless(clock: Clock, seconds: float, *events: asyncio.Event) -> None:
    """Sleep ``seconds`` on ``clock``, or less: until one of ``events`` is set (none is cleared)."""
    waiters = [
        asyncio.ensure_future(clock.sleep(seconds)),
        *(asyncio.ensure_future(e.wait()) for e in events),
    ]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # no await in here: awaiting while this task is being cancelled could swallow the
        # cancellation (a second cancel() would be caught and the caller's loop would go on)
        for waiter in waiters:
            waiter.cancel()


class ClockTimeout:
    """``asyncio.timeout`` measured on a ``Clock`` (``async with ClockTimeout(clock, s)``): the
    block is cancelled once ``seconds`` of the clock's time have passed and ``TimeoutError`` is
    raised from it; ``expired`` says so. A cancel from elsewhere during the block is left as it
    is (a ``CancelledError``), even if the time ran out too. Under a ``FakeClock`` the time runs
    only when the test moves it, as every other time of the consumer does."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.expired = False
        self._task: asyncio.Task[object] | None = None
        self._timer: asyncio.Future[None] | None = None
        self._left = False

    async def __aenter__(self) -> ClockTimeout:
        self._task = asyncio.current_task()
        self._timer = asyncio.ensure_future(self.clock.sleep(self.seconds))
        self._timer.add_done_callback(self._fire)
        return self

    def _fire(self, timer: asyncio.Future[None]) -> None:
        if timer.cancelled() or self._left or self._task is None:
            return
        self.expired = True
        self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self._left = True
        if self._timer is not None:
            self._timer.cancel()
        if self.expired and exc_type is asyncio.CancelledError and self._task is not None:
            if self._task.uncancel() == 0:  # only this timeout cancelled the block
                raise TimeoutError from exc


_ONE_MS = timedelta(milliseconds=1)


def truncate_ms(value: datetime) -> datetime:
    """MongoDB stores milliseconds; every time we compute is cut to that precision."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC, millisecond precision."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes back."""

    async def sleep(self, seconds: float) -> None:
        """Sleep on this clock's time."""


class SystemClock:
    """The local wall clock."""

    def now(self) -> datetime:
        return truncate_ms(datetime.now(UTC))

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class ServerClock:
    """A local clock corrected to the database server's clock.

    ``sync`` asks the server for its time a few times and keeps the sample with the shortest
    round trip (NTP-style midpoint estimate). After a sync, ``now()`` is that server time plus
    the *monotonic* time elapsed since, so workers whose wall clocks are wrong by an hour — or
    are stepped by NTP between two syncs — still compute lease times on the server's time. The
    consumer syncs at start and about every minute; where the server cannot tell its time (the
    fake), ``now()`` is the local wall clock.
    """

    def __init__(self, base: Clock | None = None) -> None:
        self.base: Clock = base or SystemClock()
        self.offset = timedelta(0)  # server minus local wall clock at the last sync (for reports)
        self.uncertainty = timedelta(0)
        self.synced = False
        self._anchor_time: datetime | None = None
        self._anchor_mono = 0.0
        # the last value of now() and the elapsed times it holds for (its millisecond: the
        # consumer asks several times per task, most of them within one millisecond)
        self._last: datetime | None = None
        self._last_from = 0.0
        self._last_until = 0.0

    def now(self) -> datetime:
        if self._anchor_time is None:
            return truncate_ms(self.base.now())
        elapsed = self.base.monotonic() - self._anchor_mono
        if self._last_from <= elapsed < self._last_until and self._last is not None:
            return self._last
        value = truncate_ms(self._anchor_time + timedelta(seconds=elapsed))
        # The same value up to 1 µs before the anchor's offset reaches the next millisecond
        # (timedelta rounds to the nearest µs: the margin keeps this exact); now() never
        # decreases with elapsed, so every elapsed in between gives this value too.
        self._last, self._last_from = value, elapsed
        self._last_until = (value + _ONE_MS - self._anchor_time).total_seconds() - 1e-6
        return value

    def monotonic(self) -> float:
        return self.base.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)

    async def sync(self, server_time: Callable[[], Awaitable[datetime | None]], samples: int = 3) -> bool:
        best: tuple[float, datetime, float, timedelta] | None = None
        for _ in range(samples):
            sent = self.base.monotonic()  # the base clock: a FakeClock measures no delay
            local_before = self.base.now()
            remote = await server_time()
            rtt = self.base.monotonic() - sent
            if remote is None:
                return False
            offset = remote - (local_before + timedelta(seconds=rtt / 2))
            if best is None or rtt < best[0]:
                best = (rtt, remote, sent + rtt / 2, offset)
        assert best is not None
        rtt, remote, mono_at_remote, offset = best
        # The server stores milliseconds and truncates: its true time was on average half a
        # millisecond later than it said.
        self._anchor_time = remote + timedelta(microseconds=500) if rtt > 0 else remote
        self._anchor_mono = mono_at_remote
        self._last, self._last_until = None, 0.0  # computed on the old anchor
        self.offset = offset
        self.uncertainty = timedelta(seconds=rtt / 2)
        self.synced = True
        return True


def _root(clock: object) -> object:
    """The clock a wrapper (``ServerClock``, a skewed clock) runs on."""
    seen = 0
    while hasattr(clock, "base") and seen < 10:
        clock = clock.base
        seen += 1
    return clock


def check_same_time(driver: object, clock: Clock | None, who: str) -> None:
    """Refuse a consumer or publisher on a test clock over an in-process store on the system
    clock: the store would judge what is due by real time, the consumer by the fake one, and
    nothing would run (a test that passes ``clock=`` to one of them only)."""
    store_clock = getattr(driver, "clock", None)
    if clock is None or store_clock is None or not isinstance(_root(store_clock), SystemClock):
        return
    if not isinstance(_root(clock), SystemClock):
        raise InvalidInput(
            f"{who} runs on a {type(_root(clock)).__name__} but its store on the system clock: give the "
            "store the same clock (MemoryDriver(clock=clock)), or let mscheduler.testing.scheduler_kit() "
            "build the store, the publisher and the consumers on one clock"
        )
