"""``ClockTimeout``: ``asyncio.timeout`` on the injected clock (issue 17 B6)."""

from __future__ import annotations

import asyncio

import pytest

from mscheduler.domain.clock import ClockTimeout
from mscheduler.testing.clock import FakeClock
from tests.helpers import wait_until


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_the_block_is_cancelled_when_the_clock_passes_the_timeout() -> None:
    clock = FakeClock()
    outcome: list[str] = []

    async def work() -> None:
        timeout = ClockTimeout(clock, 5.0)
        try:
            async with timeout:
                entered.set()
                await asyncio.Event().wait()
        except TimeoutError:
            outcome.append(f"timed out, expired={timeout.expired}")

    entered = asyncio.Event()
    task = asyncio.ensure_future(work())
    await entered.wait()
    clock.advance(4.999)
    await _turns()  # (what did not happen cannot be waited for: the task had its turns)
    assert not task.done()  # real time plays no part: only the clock's
    clock.advance(0.001)
    await wait_until(task.done, what="the block to be cancelled")
    assert outcome == ["timed out, expired=True"]


async def test_a_block_that_ends_in_time_is_left_alone() -> None:
    clock = FakeClock()
    async with ClockTimeout(clock, 5.0) as timeout:
        await asyncio.sleep(0)
    clock.advance(10)
    await _turns()
    assert not timeout.expired


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    clock = FakeClock()
    entered = asyncio.Event()

    async def work() -> None:
        async with ClockTimeout(clock, 5.0):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(work())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
