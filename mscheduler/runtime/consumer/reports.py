"""Checkpoints and progress of a running attempt, riding the pinger's batch.

A handler calls ``await ctx.checkpoint(data)`` / ``ctx.progress(fraction, message)``; both wait
in the attempt's ``AttemptReports`` for the next ping, which writes every running attempt's
reports with the lease renewal in one storage command (``PingParams.reports``). A checkpoint
asks the pinger to ping now (what other handlers saved meanwhile goes along) and waits for its
own confirmation; progress asks for a ping at most ``PROGRESS_WRITE_INTERVAL`` after the last
one (so a changing progress is written about once a second, however often it is reported, and
with the next ping or checkpoint if that comes first).

The write is fenced like the ping (this worker, this attempt, a running unexpired entry): a
checkpoint of an attempt that lost its lease is never stored, and ``checkpoint`` raises
``LeaseLost`` (usually the handler is cancelled at the same moment).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from mscheduler.domain.exceptions import InvalidInput, LeaseLost
from mscheduler.domain.model import check_params, encoded_size
from mscheduler.drivers.base import AttemptReport

DEFAULT_MAX_CHECKPOINT_BYTES = 256 * 1024
PROGRESS_MESSAGE_MAX = 1000
PROGRESS_WRITE_INTERVAL = 1.0  # seconds: a reported progress is written at most this long after the last ping


def checked_checkpoint(data: Any, max_bytes: int) -> Any:
    """The checkpoint as stored: JSON-like data (a pydantic model is dumped), at most
    ``max_bytes`` (BSON size); ``InvalidInput`` otherwise, and nothing is written."""
    from pydantic import BaseModel

    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    try:
        data = check_params(data, path="checkpoint")
    except ValueError as exc:
        raise InvalidInput(f"the checkpoint cannot be stored: {exc}") from exc
    size = 0 if data is None else encoded_size(data)
    if size > max_bytes:
        raise InvalidInput(
            f"the checkpoint is {size} bytes, more than max_checkpoint_bytes ({max_bytes}); "
            "store a reference to bulky data instead"
        )
    return data


def checked_progress(fraction: Any, message: Any) -> dict[str, Any]:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not math.isfinite(fraction):
        raise InvalidInput(f"progress: fraction must be a number from 0 to 1, got {fraction!r}")
    if not 0 <= fraction <= 1:
        raise InvalidInput(f"progress: fraction must be from 0 to 1, got {fraction!r}")
    if message is not None and (not isinstance(message, str) or len(message) > PROGRESS_MESSAGE_MAX):
        raise InvalidInput(f"progress: message must be a string of at most {PROGRESS_MESSAGE_MAX} characters")
    return {"fraction": float(fraction), "message": message}


class AttemptReports:
    """What one attempt's handler asked to record, until a ping has written it.

    ``flush`` asks the pinger to ping now. The newest checkpoint and the newest progress win;
    every ``save_checkpoint`` call waits until a checkpoint at least as new has landed.
    """

    def __init__(
        self,
        flush: Callable[[], None],
        max_checkpoint_bytes: int,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self._flush = flush
        self._on_progress = on_progress
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.seq = 0  # reports of this attempt sent so far (stored with each, to confirm it)
        self._checkpoint: tuple[Any] | None = None  # (data,): data may be None
        self._progress: dict[str, Any] | None = None
        self._waiters: list[asyncio.Future[None]] = []
        # sent with the ping in flight: (report, checkpoint, progress, waiters)
        self._sent: tuple[AttemptReport, tuple[Any] | None, dict[str, Any] | None, list[Any]] | None = None
        self.closed: str | None = None  # why the attempt's lease was given up

    async def save_checkpoint(self, data: Any) -> None:
        data = checked_checkpoint(data, self.max_checkpoint_bytes)
        if self.closed is not None:
            raise LeaseLost(f"the checkpoint was not saved: the attempt was {self.closed}")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._checkpoint = (data,)
        self._waiters.append(waiter)
        self._flush()
        # shielded: a handler cancelled while it waits leaves the waiter to the pinger
        await asyncio.shield(waiter)

    def set_progress(self, fraction: Any, message: Any = None) -> None:
        progress = checked_progress(fraction, message)
        if self.closed is None:  # an attempt given up on records nothing
            self._progress = progress
            if self._on_progress is not None:
                self._on_progress()

    @property
    def pending(self) -> bool:
        return self._checkpoint is not None or self._progress is not None

    def take(self) -> AttemptReport | None:
        """The report to send with this ping (None: nothing new); it is in flight until
        ``landed`` / ``not_landed``."""
        if not self.pending or self.closed is not None or self._sent is not None:
            return None
        self.seq += 1
        checkpoint, progress, waiters = self._checkpoint, self._progress, self._waiters
        self._checkpoint, self._progress, self._waiters = None, None, []
        report = AttemptReport(
            self.seq,
            save_checkpoint=checkpoint is not None,
            checkpoint=checkpoint[0] if checkpoint is not None else None,
            progress=progress,
        )
        self._sent = (report, checkpoint, progress, waiters)
        return report

    def landed(self) -> None:
        """The ping wrote the report: its checkpoint callers return."""
        if self._sent is None:
            return
        waiters = self._sent[3]
        self._sent = None
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def not_landed(self) -> None:
        """The ping did not write it (a storage error, a concurrent change): send it again with
        the next ping, unless something newer replaced it meanwhile."""
        if self._sent is None:
            return
        _, checkpoint, progress, waiters = self._sent
        self._sent = None
        if self._checkpoint is None:
            self._checkpoint = checkpoint
        if self._progress is None:
            self._progress = progress
        self._waiters[:0] = waiters

    def close(self, reason: str) -> None:
        """The lease is given up (lost, revoked, cancelled, paused, released): nothing more is
        written, and waiting checkpoint callers get ``LeaseLost``."""
        if self.closed is not None:
            return
        self.closed = reason
        waiters = [*self._waiters, *(self._sent[3] if self._sent is not None else ())]
        self._checkpoint, self._progress, self._waiters, self._sent = None, None, [], None
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(LeaseLost(f"the checkpoint was not saved: the attempt was {reason}"))
                # retrieved here, so that an unawaited one (its handler was cancelled) is quiet
                waiter.exception()
