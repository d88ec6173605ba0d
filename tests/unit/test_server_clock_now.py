"""ServerClock.now keeps its last value for the rest of its millisecond: always the value the full
computation (anchor + elapsed, cut to milliseconds) gives."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest

from mscheduler.domain.clock import ServerClock, truncate_ms


class _Base:
    """A base clock whose monotonic time the test sets."""

    def __init__(self) -> None:
        self.mono = 0.0

    def now(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC)

    def monotonic(self) -> float:
        return self.mono

    async def sleep(self, seconds: float) -> None:
        return None


@pytest.mark.parametrize("anchor_us", [0, 123, 500, 999])
def test_now_is_the_full_computation_at_every_step(anchor_us: int) -> None:
    base = _Base()
    clock = ServerClock(base)
    anchor = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=anchor_us)
    clock._anchor_time, clock._anchor_mono = anchor, 0.0
    rng = random.Random(anchor_us)
    steps = [0.0, 1e-7, 5e-7, 1e-6, 5e-6, 0.0004999, 0.0005, 0.001, -0.002]  # back too
    for _ in range(20_000):
        base.mono = max(0.0, base.mono + rng.choice(steps))
        assert clock.now() == truncate_ms(anchor + timedelta(seconds=base.mono))


async def test_a_sync_forgets_the_value_of_the_old_anchor() -> None:
    base = _Base()
    clock = ServerClock(base)
    base.mono = 10.0
    assert await clock.sync(_server_at(datetime(2026, 1, 1, tzinfo=UTC)))
    first = clock.now()
    assert await clock.sync(_server_at(datetime(2026, 6, 1, tzinfo=UTC)))
    assert clock.now() != first and clock.now().month == 6


def _server_at(when: datetime) -> Callable[[], Awaitable[datetime | None]]:
    async def server_time() -> datetime | None:
        return when

    return server_time
