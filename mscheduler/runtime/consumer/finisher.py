"""The finisher of the Consumer: handlers hand their outcomes to it (``_submit``) and it writes
them in batches, whatever piled up while the last write was in flight, in one ``finish`` command;
the flow-limit slots of written outcomes are released alongside the next batch, or with the next
acquire of their limit (``Limiter.flush``: held at most ``RELEASE_HOLD`` while the limit has room).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mscheduler.domain.clock import ServerClock
from mscheduler.domain.exceptions import ConsumerStopped, StorageError
from mscheduler.drivers.base import Driver, FinishParams
from mscheduler.runtime.consumer.limiter import Limiter

log = logging.getLogger("mscheduler.consumer")


@dataclass(slots=True)
class PendingOutcome:
    """An outcome waiting to be written. Who waits for it is told by ``future`` (``_submit``) or
    by ``then`` (``_submit_then``): ``then(accepted, None)`` once written, ``then(False, error)``
    when it cannot be."""

    params: FinishParams
    slot: str | None = None  # the flow limit whose slot is released once the outcome is written
    future: asyncio.Future[bool] | None = None
    then: Callable[[bool, BaseException | None], None] | None = None
    told: bool = False

    def tell(self, accepted: bool, error: BaseException | None = None) -> None:
        """Tell the waiter, once."""
        if self.told:
            return
        self.told = True
        if self.future is not None:
            if not self.future.done():
                if error is not None:
                    self.future.set_exception(error)
                else:
                    self.future.set_result(accepted)
        elif self.then is not None:
            try:
                self.then(accepted, error)
            except Exception:  # one attempt's bookkeeping must not stop the finisher
                log.exception("bookkeeping after the outcome of %s failed", self.params.key)


class ConsumerFinisher:
    """The finisher side task of ``Consumer`` (a mixin: it uses the consumer's driver, limiter
    and side tasks, ``_storage_trouble`` and ``_sync_parents_of``)."""

    driver: Driver
    clock: ServerClock
    limiter: Limiter
    worker_id: str
    poll_interval: float
    _side: dict[str, asyncio.Task[None]]
    _pending: list[PendingOutcome]
    _pending_added: asyncio.Event
    _hold_timer: asyncio.Future[None] | None = None  # wakes the finisher when held releases fall due
    _hold_due: float = 0.0

    if TYPE_CHECKING:

        async def _storage_trouble(self, what: str, exc: StorageError, *, back_off: bool = True) -> None: ...

        def _sync_parents_of(self, keys: Iterable[str]) -> None: ...

    async def _submit(self, params: FinishParams, slot: str | None = None) -> bool:
        finisher = self._side.get("finisher")
        if finisher is None or finisher.done():
            raise ConsumerStopped("the finisher is not running: the outcome cannot be written")
        pending = PendingOutcome(params, slot, asyncio.get_running_loop().create_future())
        self._pending.append(pending)
        self._pending_added.set()
        assert pending.future is not None
        return await asyncio.shield(pending.future)

    def _submit_then(
        self,
        params: FinishParams,
        slot: str | None,
        then: Callable[[bool, BaseException | None], None],
    ) -> None:
        """``_submit`` without a waiter: ``then(accepted, error)`` is called by the finisher once
        the outcome is written (or cannot be). A handler's task ends with its handler: no future,
        shield or wake-up of its own per attempt. Raises ``ConsumerStopped`` as ``_submit`` does."""
        finisher = self._side.get("finisher")
        if finisher is None or finisher.done():
            raise ConsumerStopped("the finisher is not running: the outcome cannot be written")
        self._pending.append(PendingOutcome(params, slot, then=then))
        self._pending_added.set()

    async def _run_finisher(self) -> None:
        try:
            while True:
                if not self._pending:
                    self._pending_added.clear()
                    wait = self.limiter.release_due_in(self.clock.now())
                    if wait is None:
                        await self._pending_added.wait()
                    elif wait > 0:  # releases held for the next acquire: until due, or an outcome
                        self._wake_in(wait)
                        await self._pending_added.wait()
                        continue
                await self._flush()
        finally:
            if self._hold_timer is not None:
                self._hold_timer.cancel()

    def _wake_in(self, seconds: float) -> None:
        """Set ``_pending_added`` in ``seconds`` (on the clock): when held releases fall due. One
        timer serves every loop turn until then (a hold's due time only comes later for
        releases added later), not a sleep of its own per turn."""
        due = self.clock.monotonic() + seconds
        timer = self._hold_timer
        if timer is not None and not timer.done() and self._hold_due <= due:
            return
        if timer is not None:
            timer.cancel()
        self._hold_due = due
        self._hold_timer = asyncio.ensure_future(self._wake_after(seconds))

    async def _wake_after(self, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self._pending_added.set()

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            if self.limiter.releases and not await self.limiter.flush(self.clock.now()):
                await self.clock.sleep(self.poll_interval)  # the store refuses: not in a tight loop
            return
        # The slots of the outcomes written by earlier flushes are released alongside this
        # batch's finish (their outcomes are known already): no round trip of its own.
        now = self.clock.now()
        release = (
            asyncio.ensure_future(self.limiter.flush(now))
            if self.limiter.releases and self.limiter.any_due(now)
            else None
        )  # no task of its own for a flush that would release nothing (held releases)
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
                    p.tell(False, exc)
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
            if p.future is not None:
                p.tell(ok)
        for p in batch:  # written (or refused: the lease had gone): the slot is free; released
            if p.slot is not None:  # with the next finish batch, or by the next loop turn
                self.limiter.release(p.slot, self.worker_id, p.params.attempt)
        for p, ok in zip(batch, accepted, strict=True):  # the handlers' bookkeeping, in order
            if p.then is not None:
                p.tell(ok)

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
