"""Test helpers: wait for consumer events instead of sleeping (STYLE 10)."""

from __future__ import annotations

import asyncio
from collections import Counter
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
