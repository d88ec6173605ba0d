"""The pinger of the Consumer: one write per interval renews the leases of all running attempts,
with the checkpoints and progress the handlers saved since the last ping.

It is also where attempts are given up: an answer that says a lease is lost, revoked, cancelled
or paused, a stop event from the change stream, or a lease past its trust limit while the store
does not answer (``_lose`` cancels the handler; fencing keeps the store safe either way).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from mscheduler.domain.clock import ServerClock, sleep_unless
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import AttemptReport, ChangeEvent, Driver, PingParams, PingResult
from mscheduler.runtime.consumer.limiter import Limiter
from mscheduler.runtime.consumer.reports import PROGRESS_WRITE_INTERVAL
from mscheduler.runtime.consumer.runner import RunningAttempt
from mscheduler.services.events import EventKind, EventRecorder

log = logging.getLogger("mscheduler.consumer")


def _silence(future: asyncio.Future[Any]) -> None:
    """Retrieve a future's exception whenever it ends, so that a future given up on (a ping in
    flight when the consumer stops) is never reported as 'exception was never retrieved'."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


class ConsumerPinger:
    """The pinger side task of ``Consumer`` (a mixin: it uses the consumer's driver, limiter and
    running attempts, and the runner's ``_fields`` for its log records)."""

    driver: Driver
    clock: ServerClock
    limiter: Limiter
    events: EventRecorder | None
    worker_id: str
    groups: tuple[str, ...]
    claim_lease: timedelta | None
    _running: dict[str, RunningAttempt]
    _ping_wake: asyncio.Event
    _ping_now: asyncio.Event
    _progress_set: asyncio.Event
    _last_ping: float

    if TYPE_CHECKING:

        def _emit(self, event: str, data: dict[str, Any]) -> None: ...

        def _fields(self, running: RunningAttempt, **more: Any) -> dict[str, Any]: ...

        def _record_event(
            self, running: RunningAttempt, kind: EventKind, detail: dict[str, Any] | None = None
        ) -> None: ...

        async def _storage_trouble(self, what: str, exc: StorageError, *, back_off: bool = True) -> None: ...

    def _ping_interval(self) -> float:
        """The shortest ping interval of the running tasks; a capped first lease (claim_lease,
        or a flow-limit slot's lease for an attempt holding a slot) is renewed within a third of
        it."""
        intervals = [float(r.option["ping_interval_ms"]) / 1000 for r in self._running.values()]
        cap = self.claim_lease
        if cap is None and any(r.slot is not None for r in self._running.values()):
            cap = self.limiter.slot_lease
        if cap is not None:
            intervals.append(cap.total_seconds() / 3)
        return min(intervals)

    async def _run_pinger(self) -> None:
        while True:
            if not self._running:
                self._ping_wake.clear()
                await self._ping_wake.wait()
                continue
            # Wake at the next ping, or earlier where a lease stops being trusted (pings failing).
            sleep = self._ping_interval()
            ends = [r.trust_until for r in self._running.values() if r.trusted]
            if ends:
                sleep = min(sleep, max((min(ends) - self.clock.now()).total_seconds(), 0.0))
            progress_due = self._last_ping + PROGRESS_WRITE_INTERVAL - self.clock.monotonic()
            if self._progress_set.is_set():  # written at most a second after the last ping
                sleep = min(sleep, max(progress_due, 0.0))
            if await self._sleep_or_ping_now(sleep):
                # A checkpoint (or a stop to confirm) asked for it: let the other handlers that
                # are ready run first, so that what they save goes in the same write.
                await asyncio.sleep(0)
            elif (
                self._progress_set.is_set()
                and self.clock.monotonic() < self._last_ping + PROGRESS_WRITE_INTERVAL
            ):
                continue  # progress came during the sleep: sleep again, until its write is due
            if self._running:
                # A ping that succeeds proves the lease is still ours, even after a long stall;
                # one that fails or hangs past a lease's trust limit gives that lease up.
                await self.ping_once()

    async def _sleep_or_ping_now(self, seconds: float) -> bool:
        """Sleep ``seconds`` on the consumer's clock, or less if a ping is asked for (True) or
        progress comes (False: the caller works out when its write is due)."""
        if self._ping_now.is_set():
            return True
        events = (self._ping_now,) if self._progress_set.is_set() else (self._ping_now, self._progress_set)
        await sleep_unless(self.clock, seconds, *events)
        return self._ping_now.is_set()

    async def ping_once(self) -> None:
        """Renew every running attempt's lease in one write per lease length, with the
        checkpoints and progress the handlers saved since the last ping (same write)."""
        self._ping_now.clear()  # what is asked from here on goes with the next ping
        self._progress_set.clear()
        self._last_ping = self.clock.monotonic()
        now = self.clock.now()
        groups: dict[Any, dict[str, str]] = {}
        # Handlers given up on (lost, revoked, released) are not kept alive; a handler that
        # returned is, until its outcome is written.
        snapshot = {key: r for key, r in self._running.items() if r.cancel_reason is None}
        if not snapshot:
            return
        reports: dict[str, AttemptReport] = {}
        for key, running in snapshot.items():
            expire = now + timedelta(milliseconds=running.option["worker_timeout_ms"])
            groups.setdefault(expire, {})[key] = running.claimed.attempt
            report = running.reports.take() if running.reports is not None else None
            if report is not None:
                reports[key] = report
        groups = await self._extend_slots(now, snapshot, groups)
        if not any(groups.values()):
            return
        try:
            params = PingParams(self.worker_id, now, groups, reports, worker_groups=self.groups)
            result = await self._ping_within_leases(params, snapshot)
        except StorageError as exc:
            for key in reports:
                self._report_outcome(snapshot[key], landed=False)
            self._expire_locally(snapshot)
            await self._storage_trouble("ping", exc, back_off=False)
            return
        recorded = set(result.recorded)
        for key in reports:
            self._report_outcome(snapshot[key], landed=key in recorded)
        for key, option in result.alive.items():
            running = snapshot[key]
            running.option = option
            running.expire = now + timedelta(milliseconds=option["worker_timeout_ms"])
        for key in result.lost:
            self._lose(snapshot[key], "lost")
        for key in result.revoked:
            self._lose(snapshot[key], "revoked")
        for key in result.cancelled:
            self._lose(snapshot[key], "cancelled")
        for key in result.paused:
            self._lose(snapshot[key], "paused")
        self._emit(
            "ping",
            {
                "alive": len(result.alive),
                "lost": len(result.lost),
                "revoked": len(result.revoked),
                "cancelled": len(result.cancelled),
                "paused": len(result.paused),
                "recorded": len(recorded),
            },
        )

    async def _extend_slots(
        self, now: datetime, snapshot: dict[str, RunningAttempt], groups: dict[Any, dict[str, str]]
    ) -> dict[Any, dict[str, str]]:
        """Before the leases are renewed, extend the flow-limit slots of those attempts to the
        same expiry (so a slot never ends before its lease). An attempt whose slot is gone is
        given up (its lease is not renewed); one whose slot could not be confirmed (a storage
        error) is not renewed this time."""
        slots: dict[str, dict[str, Any]] = {}
        key_of: dict[str, str] = {}
        for expire, attempts in groups.items():
            for key, attempt in attempts.items():
                slot = snapshot[key].slot
                if slot is not None:
                    slots.setdefault(slot, {})[attempt] = expire
                    key_of[attempt] = key
        if not slots:
            return groups
        gone, unknown = await self.limiter.extend(now, self.worker_id, slots)
        for attempt in gone:
            self._lose(snapshot[key_of[attempt]], "lost")
        skipped = gone | unknown
        if not skipped:
            return groups
        self._expire_locally({key_of[a]: snapshot[key_of[a]] for a in unknown})
        return {
            expire: {k: a for k, a in attempts.items() if a not in skipped}
            for expire, attempts in groups.items()
        }

    @staticmethod
    def _report_outcome(running: RunningAttempt, *, landed: bool) -> None:
        if running.reports is None:
            return
        if landed:
            running.reports.landed()
        else:  # sent again with the next ping (a lost lease closes the reports in _lose)
            running.reports.not_landed()

    def _stop_requested(self, event: ChangeEvent) -> None:
        """A change event says an operator stopped a task's running attempts (cancel, or pause
        with ``stop_running``): if one is ours, stop its handler now rather than at its next
        ping. The store has applied the change already (its later writes are fenced out)."""
        running = self._running.get(event.key)
        if running is None or not running.trusted:
            return
        if event.stop_attempts is None or event.stop not in ("cancel", "pause"):
            self._ping_now.set()  # the event does not say whose attempts: ask the store
            return
        if running.claimed.attempt in event.stop_attempts:
            self._lose(running, "cancelled" if event.stop == "cancel" else "paused")

    async def _ping_within_leases(
        self, params: PingParams, snapshot: dict[str, RunningAttempt]
    ) -> PingResult:
        """Send the ping, but stop trusting each lease at its known end while the reply is late.

        A handler whose lease passed its end is cancelled (and writes nothing) even if the store
        does not answer: by then another worker may own the task (River's rule; fencing keeps
        the store safe either way, this keeps the *work* from running twice at once).
        """
        ping = asyncio.ensure_future(self.driver.ping(params))
        _silence(ping)
        try:
            while not ping.done():
                ends = [r.trust_until for r in snapshot.values() if r.trusted]
                if not ends:
                    return await ping
                timeout = max((min(ends) - self.clock.now()).total_seconds(), 0.0)
                timer = asyncio.ensure_future(self.clock.sleep(timeout))
                try:
                    await asyncio.wait({ping, timer}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    timer.cancel()
                if not ping.done():
                    self._expire_locally(snapshot)
            return ping.result()
        finally:
            if not ping.done():
                ping.cancel()

    def _expire_locally(self, snapshot: dict[str, RunningAttempt]) -> None:
        """Without a store to ask, a lease past its known end is lost: stop those handlers."""
        now = self.clock.now()
        for running in snapshot.values():
            if running.trust_until <= now:
                self._lose(running, "lost")

    def _lose(self, running: RunningAttempt, reason: str) -> None:
        if running.cancel_reason is None and not running.handler_done and reason == "paused":
            log.info(
                "task %s: stopped by a pause (attempt released, not counted); cancelling its handler",
                running.claimed.key,
                extra=self._fields(running, reason=reason),
            )
            self._emit(reason, {"key": running.claimed.key, "attempt": running.claimed.attempt})
        elif running.cancel_reason is None and not running.handler_done:
            log.warning(
                "task %s: lease %s; cancelling its handler",
                running.claimed.key,
                {
                    "lost": "lost",
                    "cancelled": "of a cancelled task",
                }.get(reason, "revoked (this worker is no longer allowed)"),
                extra=self._fields(running, reason=reason),
            )
            self._emit(reason, {"key": running.claimed.key, "attempt": running.claimed.attempt})
            if reason == "lost" and self.events is not None:
                self._record_event(running, EventKind.LEASE_LOST, {"by": "ping"})
        running.cancel(reason)
