"""Test helpers: wait for consumer events instead of sleeping (STYLE 10)."""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mscheduler import Consumer
from mscheduler.drivers.base import Driver


def as_driver(wrapper: object) -> Driver:
    """A wrapper of a driver (``FaultyDriver``, the consumer tests' ``WrappedDriver``) as the
    ``Driver`` it stands for: it passes the operations it does not wrap on through
    ``__getattr__``, which a type checker cannot see."""
    return cast(Driver, wrapper)


class Recorder:
    """Collects a consumer's events; ``await recorder.wait(event, n)`` until n have happened."""

    def __init__(self, *consumers: Consumer) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.counts: Counter[str] = Counter()
        self._changed = asyncio.Event()
        for consumer in consumers:
            self.attach(consumer)

    def attach(self, consumer: Consumer) -> None:
        worker_id = consumer.worker_id

        def listener(event: str, data: dict[str, Any]) -> None:
            self.events.append((worker_id, event, data))
            self.counts[event] += 1
            self._changed.set()

        consumer.add_listener(listener)

    def of(self, event: str) -> list[tuple[str, dict[str, Any]]]:
        return [(w, d) for w, e, d in self.events if e == event]

    async def wait(self, event: str, count: int = 1, timeout: float = 10.0) -> None:
        async def until() -> None:
            while self.counts[event] < count:
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(until(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"waited {timeout}s for {count} {event!r} events, saw {self.counts[event]}: {self.counts}"
            ) from None


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, what: str = ""
) -> None:
    """Wait until ``condition()`` holds: checked at each turn of the event loop for the first
    hundred turns (the memory driver and mongomock never wait), then every 5 ms (a real server's
    replies take wall time), for at most ``timeout`` real seconds; then fail, saying what was
    waited for. Use it instead of a fixed number of loop turns or a nap."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    turns = 0
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if loop.time() > deadline:
            raise AssertionError(f"waited {timeout}s for {what or condition}")
        turns += 1
        await asyncio.sleep(0 if turns < 100 else 0.005)
