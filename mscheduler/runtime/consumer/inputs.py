"""A workflow step's inputs, read for many steps at once: the steps a consumer claimed together
start together, and each asks for the results of what it needs; ``StepInputs`` gathers those
asks for one turn of the event loop and makes one ``Driver.read_results`` of them all (with
MongoDB one round trip per claim batch, not one per step)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence

from mscheduler.drivers.base import Driver, StepResult


class StepInputs:
    """``await read(keys)`` gives ``{key: StepResult}`` for those keys (missing ones left out),
    read together with the other asks of the same loop turn. A read that fails fails every
    ask of its batch. Each ask gets results of its own (copies where two asks share a key)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.reads = 0  # read_results calls made
        self._asks: list[tuple[Sequence[str], asyncio.Future[dict[str, StepResult]]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def read(self, keys: Sequence[str]) -> dict[str, StepResult]:
        future: asyncio.Future[dict[str, StepResult]] = asyncio.get_running_loop().create_future()
        self._asks.append((keys, future))
        if self._flushing is None:
            self._flushing = asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the other steps started with this one ask first
        asks, self._asks, self._flushing = self._asks, [], None
        wanted = list(dict.fromkeys(k for keys, _ in asks for k in keys))
        try:
            self.reads += 1
            found = await self.driver.read_results(wanted)
        except BaseException as exc:  # each ask raises it (a crash's too: its steps die with it)
            for _, future in asks:
                if not future.done():
                    future.set_exception(exc)
            return
        seen: set[str] = set()
        for keys, future in asks:
            mine = {}
            for key in keys:
                if key in found:
                    # one ask's results must not be another's (a handler may change what it got)
                    mine[key] = found[key] if key not in seen else copy.deepcopy(found[key])
                    seen.add(key)
            if not future.done():
                future.set_result(mine)
