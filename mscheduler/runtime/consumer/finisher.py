"""The finisher of the Consumer: handlers hand their outcomes to it (``_submit``) and it writes
them in batches, whatever piled up while the last write was in flight, in one ``finish`` command;
the flow-limit slots of written outcomes are released alongside the next batch, or with the next
acquire of their limit (``Limiter.flush``: held at most ``RELEASE_HOLD`` while the limit has room).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mscheduler.domain.clock import ServerClock, sleep_unless
from mscheduler.domain.exceptions import ConsumerStopped, StorageError
from mscheduler.drivers.base import Driver, FinishParams
from mscheduler.runtime.consumer.limiter import Limiter

log = logging.getLogger("mscheduler.consumer")


@dataclass(slots=True)
class _Pending:
    params: FinishParams
    slot: str | None = None  # the flow limit whose slot is released once the outcome is written
    future: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ConsumerFinisher:
    """The finisher side task of ``Consumer`` (a mixin: it uses the consumer's driver, limiter
    and side tasks, ``_storage_trouble`` and ``_sync_parents_of``)."""

    driver: Driver
    clock: ServerClock
    limiter: Limiter
    worker_id: str
    poll_interval: float
    _side: dict[str, asyncio.Task[None]]
    _pending: list[_Pending]
    _pending_added: asyncio.Event

    if TYPE_CHECKING:

        async def _storage_trouble(self, what: str, exc: StorageError, *, back_off: bool = True) -> None: ...

        def _sync_parents_of(self, keys: Iterable[str]) -> None: ...

    async def _submit(self, params: FinishParams, slot: str | None = None) -> bool:
        finisher = self._side.get("finisher")
        if finisher is None or finisher.done():
            raise ConsumerStopped("the finisher is not running: the outcome cannot be written")
        pending = _Pending(params, slot)
        self._pending.append(pending)
        self._pending_added.set()
        return await asyncio.shield(pending.future)

    async def _run_finisher(self) -> None:
        while True:
            if not self._pending:
                self._pending_added.clear()
                wait = self.limiter.release_due_in(self.clock.now())
                if wait is None:
                    await self._pending_added.wait()
                elif wait > 0:  # releases held for the next acquire: until due, or an outcome
                    await sleep_unless(self.clock, wait, self._pending_added)
                    continue
            await self._flush()

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            if self.limiter.releases and not await self.limiter.flush(self.clock.now()):
                await self.clock.sleep(self.poll_interval)  # the store refuses: not in a tight loop
            return
        # The slots of the outcomes written by earlier flushes are released alongside this
        # batch's finish (their outcomes are known already): no round trip of its own.
        release = (
            asyncio.ensure_future(self.limiter.flush(self.clock.now())) if self.limiter.releases else None
        )
        try:
            accepted = await self.driver.finish([p.params for p in batch])
        except StorageError as exc:
            if release is not None:
                await release
            if exc.config:
                # The consumer stops on this: fail what piled up meanwhile too, so that no
                # handler waits for ever on a write that nobody will make.
                failed, self._pending = [*batch, *self._pending], []
                for p in failed:
                    if not p.future.done():
                        p.future.set_exception(exc)
                raise
            # Still unknown after the driver's own retries, or refused: keep them and try again
            # (fenced: once a lease has moved on, the store refuses the outcome and says so).
            self._pending[:0] = batch
            await self._storage_trouble("writing outcomes", exc)
            await self.clock.sleep(self.poll_interval)
            return
        if release is not None:
            await release
        self._sync_parents_of(p.params.key for p, ok in zip(batch, accepted, strict=True) if ok)
        for p, ok in zip(batch, accepted, strict=True):
            if not p.future.done():
                p.future.set_result(ok)
        for p in batch:  # written (or refused: the lease had gone): the slot is free; released
            if p.slot is not None:  # with the next finish batch, or by the next loop turn
                self.limiter.release(p.slot, self.worker_id, p.params.attempt)

    async def _drain_finisher(self) -> None:
        finisher = self._side.get("finisher")
        while self._pending and finisher is not None and not finisher.done():
            await asyncio.sleep(0)
            try:
                await self._flush()
            except StorageError as exc:  # the futures carry it to the handlers; stop goes on
                log.error("could not write outcomes while stopping: %s", exc)
                return
        if self.limiter.releases:  # one try: slots not released run out at their expiry
            await self.limiter.flush(self.clock.now(), everything=True)
