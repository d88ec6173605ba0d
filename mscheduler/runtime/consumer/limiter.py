"""The consumer's side of flow limits (the store's side is ``mscheduler.domain.limits``).

Per claim: the names of this consumer that a limit covers are claimed apart, one limit at a time:
acquire slots (one write on the limit's document), claim at most that many tasks of those names
with the grants' attempt tokens, the same ``now`` and a first lease capped at the slots' expiry,
then settle (one write, only when needed): give back the grants the claim did not use (with their
rate starts) and shorten the used slots to their tasks' first leases. Unlimited names are claimed
as before. A limit that refused waits ``backoff`` (jittered; for a rate, until its window frees a
start) before this consumer asks again, and its names do not hold up the others'.

Per ping: the slots of the running attempts are extended first (one write per limit) to the same
expiry their leases get; an attempt whose slot is gone is not pinged (its lease runs out; its
handler is given up like a lost lease). Per finish: the slots are released after the outcomes are
written - with the next acquire of that limit by the same worker (``AcquireParams.release``: no write
of their own) while the limit was at most half full at the last acquire and nobody waits for it,
for at most ``RELEASE_HOLD``; else in one write per limit per batch. Which limit covers which name
is read from the store every ``refresh`` seconds (per name, for the names a claim asks for).

One ``Limiter`` serves one consumer, or one API server's remote executors
(``mscheduler.remote``): the worker id of each operation is the claim's (``ClaimParams.worker_id``)
or given, so the slots it takes are stamped with the worker that runs the attempt; a limit's
backoff is shared by the workers of one ``Limiter`` (a refusal for one executor holds back the
others' acquires too, as one consumer's claims are held back). Everything that must outlive a
request is in the store (the slots, by attempt token and worker): the in-memory state is the
name -> limit mapping cache, the backoff, the releases not yet flushed (they run out at their
expiry if never sent) and the optional reserve.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.limits import DEFAULT_SLOT_LEASE
from mscheduler.drivers.base import AcquireParams, ClaimedTask, ClaimParams, Driver, SlotsParams

log = logging.getLogger("mscheduler.consumer")
RESERVE_ROUNDS = 4  # an acquire far from max_running asks for this many claim batches
# How long the release of an ended attempt's slot may wait for the next acquire of its limit by
# the same worker (which then carries it), while the limit is at most half full (with room for a
# reserve: as long as a reserved grant is kept, half a slot lease): a release in a command of its
# own per finish batch would be a second write per claim round on the limit's document. Held
# slots only make a limit stricter, never looser.
RELEASE_HOLD = timedelta(seconds=1)
NAMES_KEPT = 10_000  # task names whose limit (or none) a Limiter remembers


def attempt_tokens(n: int) -> list[str]:
    """``n`` fresh attempt tokens, 16 hex digits each (``secrets.token_hex(8)``'s, from one read
    of the OS's randomness for the whole claim instead of one per attempt)."""
    random_hex = os.urandom(8 * n).hex()
    return [random_hex[i : i + 16] for i in range(0, 16 * n, 16)]


class Limiter:
    """Limit bookkeeping of one consumer, or of one API server's remote executors (no I/O of its
    own beyond the driver's operations).

    :param on_free: called with a limit's key when a release frees a slot of a limit that had
        refused (the API server wakes the leases waiting on it).
    """

    def __init__(
        self,
        driver: Driver,
        *,
        refresh: float,
        backoff: float,
        slot_lease: timedelta | None,
        rng: random.Random,
        reserve: bool = False,
        on_free: Callable[[str], None] | None = None,
    ) -> None:
        self.driver = driver
        self.refresh = refresh
        self.backoff = backoff
        self.slot_lease = slot_lease or DEFAULT_SLOT_LEASE
        self.rng = rng
        self.reserve_enabled = reserve
        self.on_free = on_free
        self.limit_of: dict[str, str] = {}  # name -> limit key (names without a limit: absent)
        self._read_at: OrderedDict[str, float] = OrderedDict()  # name -> monotonic time read
        self.wait_until: dict[str, datetime] = {}  # limit key -> when to ask again after a refusal
        # (limit key, worker id) -> attempts whose slot to release
        self.releases: dict[tuple[str, str], list[str]] = {}
        self._held_since: dict[tuple[str, str], datetime] = {}  # when a flush first kept them
        # limits at most half full at this Limiter's last acquire: their releases may wait
        self.ample: set[str] = set()
        self.release_hold = RELEASE_HOLD
        # "release_held": releases sent because their hold ran out (RELEASE_HOLD): at most one per
        # limit and worker per hold, a time-driven count (benchmarks/commands_per_task.py)
        self.commands = {
            "acquire": 0,
            "settle": 0,
            "extend": 0,
            "release": 0,
            "release_held": 0,
            "refused": 0,
        }
        # With ``reserve`` (Consumer(limit_reserve=True)): grants kept for the next claims
        # ((limit key, worker id) -> [(attempt, slot expiry)]). While a limit without a rate is far
        # from its max_running, an acquire asks for RESERVE_ROUNDS batches and the claims of the
        # next rounds use the spare grants without an acquire of their own. Spare grants are live
        # slots (counted against max_running; given back when half a slot lease old, or at stop).
        # A reserved grant carries no start; a rate added to the limit later counts it as one
        # while its slot is held and when it leaves (domain.limits.pre_rate_slot).
        self.reserve: dict[tuple[str, str], list[tuple[str, datetime]]] = {}
        self.roomy: set[str] = set()  # limits whose last acquire left room for a reserve

    def structure_sizes(self) -> dict[str, int]:
        """Entries of this limiter's maps: per name, per limit, and the attempts whose slots wait
        for a release or are reserved (bounded by the running attempts and a claim's reserve)."""
        return {
            "limit_names": len(self.limit_of) + len(self._read_at),
            "limit_keys": len(self.wait_until) + len(self.ample) + len(self.roomy) + len(self._held_since),
            "releases_waiting": sum(map(len, self.releases.values())),
            "reserved_grants": sum(map(len, self.reserve.values())),
        }

    async def maybe_refresh(self, names: Sequence[str], monotonic: float) -> None:
        """Read which limit covers those of ``names`` not read for ``refresh`` seconds (one
        ``limit_keys`` read for all of them); on a storage error keep the last known mapping."""
        stale = [n for n in names if monotonic - self._read_at.get(n, -math.inf) >= self.refresh]
        if not stale:
            return
        for name in stale:
            self._read_at[name] = monotonic
            self._read_at.move_to_end(name)
        try:
            found = await self.driver.limit_keys(stale)
        except StorageError as exc:  # the next refresh tries again
            log.warning("could not read the flow limits (%s); keeping the last known ones", exc)
            return
        for name in stale:
            limit = found.get(name)
            if limit is None:
                self.limit_of.pop(name, None)
            else:
                self.limit_of[name] = limit.key
                if limit.rated:  # a rate added since the grants were reserved: no start uncounted
                    self._give_back_reserve(limit.key)
        while len(self._read_at) > NAMES_KEPT:
            self.limit_of.pop(self._read_at.popitem(last=False)[0], None)
        keys = set(self.limit_of.values())
        for key in [k for k in self.wait_until if k not in keys]:
            del self.wait_until[key]

    def _give_back_reserve(self, key: str) -> None:
        """The reserved grants of limit ``key`` go with the next release: none of them starts a
        task once a rate is known to count that limit's starts."""
        self.roomy.discard(key)
        for where in [w for w in self.reserve if w[0] == key]:
            self.releases.setdefault(where, []).extend(a for a, _ in self.reserve.pop(where))

    def limits_of(self, names: Sequence[str]) -> set[str]:
        """The keys of the limits (as last read) that cover some of ``names``."""
        return {key for name in names if (key := self.limit_of.get(name)) is not None}

    def retry_due(self, now: datetime) -> bool:
        return any(when <= now for when in self.wait_until.values())

    def next_retry(self, keys: set[str] | None = None) -> datetime | None:
        """When a limit that refused may be asked again (of ``keys`` only, if given)."""
        return min((w for k, w in self.wait_until.items() if keys is None or k in keys), default=None)

    def _refused(self, key: str, now: datetime, hint: datetime | None) -> None:
        self.commands["refused"] += 1
        pause = timedelta(seconds=self.backoff * (0.5 + self.rng.random()))
        self.wait_until[key] = max(hint, now) if hint is not None else now + pause

    async def claim(
        self, params: ClaimParams, claim: Callable[[ClaimParams], Awaitable[list[ClaimedTask]]]
    ) -> list[ClaimedTask]:
        """Claim up to ``len(params.attempts)`` tasks of ``params.names``, limits obeyed."""
        now = params.now
        groups: dict[str, list[str]] = {}
        free_names = []
        for name in params.names:
            key = self.limit_of.get(name)
            if key is None:
                free_names.append(name)
            else:
                groups.setdefault(key, []).append(name)
        attempts = list(params.attempts)
        claimed: list[ClaimedTask] = []
        # a lane is found empty only if every claim that visited it found it empty (the claims
        # of a limit's names and of the unlimited ones read different tasks)
        exhausted: list[list[str | None]] = []

        def part_of_claim(**changes: Any) -> ClaimParams:
            found: list[str | None] | None = [] if params.exhausted is not None else None
            if found is not None:
                exhausted.append(found)
            return replace(params, **changes, exhausted=found)

        for key, names in groups.items():
            if not attempts:
                break
            when = self.wait_until.get(key)
            if when is not None and when > now:
                continue  # refused lately: ask again after the backoff
            self.wait_until.pop(key, None)
            got, attempts, unlimited = await self._claim_limited(
                params, key, names, attempts, claim, part_of_claim
            )
            claimed += got
            if unlimited:  # the limit was removed meanwhile
                free_names += names
        if free_names:
            # the unlimited names get every attempt the limited ones did not start: those not
            # granted, and fresh ones for grants their claim found no task for (a grant's token
            # stays its slot's until released or used from the reserve)
            shortfall = len(params.attempts) - len(claimed) - len(attempts)
            if shortfall > 0:
                attempts = [*attempts, *attempt_tokens(shortfall)]
            if attempts:
                claimed += await claim(part_of_claim(names=free_names, attempts=attempts))
        if params.exhausted is not None and exhausted:
            empty = set.intersection(*(set(e) for e in exhausted))
            params.exhausted.extend(lane for lane in dict.fromkeys(params.lanes) if lane in empty)
        return claimed

    def _from_reserve(
        self, key: str, worker_id: str, n: int, now: datetime
    ) -> tuple[list[tuple[str, datetime]], list[str]]:
        """Up to ``n`` fresh reserved grants of ``key`` for ``worker_id`` (unused for less than
        half a slot lease) with their slots' expiry, and the stale ones (to give back)."""
        kept = self.reserve.pop((key, worker_id), None)
        if not kept:
            return [], []
        fresh_after = now + self.slot_lease / 2  # computed once: up to RESERVE_ROUNDS batches
        fresh = [grant for grant in kept if grant[1] > fresh_after]
        stale = [a for a, expire in kept if expire <= fresh_after] if len(fresh) < len(kept) else []
        if fresh[n:]:
            self.reserve[(key, worker_id)] = fresh[n:]
        return fresh[:n], stale

    async def _claim_limited(
        self,
        params: ClaimParams,
        key: str,
        names: list[str],
        attempts: list[str],
        claim: Callable[[ClaimParams], Awaitable[list[ClaimedTask]]],
        part_of_claim: Callable[..., ClaimParams],
    ) -> tuple[list[ClaimedTask], list[str], bool]:
        now, worker_id = params.now, params.worker_id
        n = len(attempts)
        reserved, stale = self._from_reserve(key, worker_id, n, now)
        if stale:
            self.releases.setdefault((key, worker_id), []).extend(stale)  # with the next finish batch
        retry_at: datetime | None = None
        from_reserve = len(reserved) == n
        if from_reserve:  # no acquire this round: the claim uses reserved grants
            granted = [a for a, _ in reserved]
            rest = attempts
            expire = min(e for _, e in reserved)  # every first lease ends by then
        else:
            self.releases.setdefault((key, worker_id), []).extend(a for a, _ in reserved)  # afresh
            extra = (
                [f"{a}r{i}" for i in range(RESERVE_ROUNDS - 1) for a in attempts] if key in self.roomy else []
            )
            expire = now + self.slot_lease
            self.commands["acquire"] += 1
            # the slots of this worker's ended attempts go with the acquire (one write)
            ended = self.releases.pop((key, worker_id), [])
            self._held_since.pop((key, worker_id), None)
            try:
                result = await self.driver.acquire_slots(
                    AcquireParams(key, worker_id, [*attempts, *extra], now, expire, release=ended)
                )
            except BaseException:
                if ended:  # still to release (a release is idempotent if it was applied)
                    self.releases.setdefault((key, worker_id), [])[:0] = ended
                raise
            if not result.limited:
                return [], attempts, True
            cap = result.max_running
            if cap is None or result.live * 2 <= cap:
                self.ample.add(key)
            else:
                self.ample.discard(key)
            roomy = self.reserve_enabled and not result.rate and cap is not None
            if roomy and cap is not None and result.live + n * RESERVE_ROUNDS <= cap // 2:
                self.roomy.add(key)
            else:
                self.roomy.discard(key)
            granted, spare = result.granted[:n], result.granted[n:]
            if spare:
                self.reserve.setdefault((key, worker_id), []).extend((a, expire) for a in spare)
            taken = set(granted)
            rest = [a for a in attempts if a not in taken]
            retry_at = result.retry_at
            if not granted:
                self._refused(key, now, retry_at)
                return [], rest, False
        lease = expire - now if params.max_lease is None else min(params.max_lease, expire - now)
        # A claim that fails may still have been applied (a lost reply the driver could not
        # resolve): its grants are kept, not released, and run out at their expiry, which is no
        # earlier than any lease that claim can have made. Likewise the attempts the driver
        # reports uncertain.
        uncertain: list[str] = []
        got = await claim(part_of_claim(names=names, attempts=granted, max_lease=lease, uncertain=uncertain))
        if len(granted) < len(attempts) and len(got) == len(granted):
            self._refused(key, now, retry_at)  # the limit binds and there is more work
        used = {task.attempt: task.ping_expire_time for task in got}
        unused = [a for a in granted if a not in used and a not in uncertain]
        if unused and key in self.roomy:  # kept for the next rounds: no write now
            self.reserve.setdefault((key, worker_id), []).extend((a, expire) for a in unused)
            unused = []
        shorten = {a: e for a, e in used.items() if e < expire}
        if unused or shorten:
            self.commands["settle"] += 1
            try:
                await self.driver.update_slots(
                    SlotsParams(key, worker_id, now, extend=shorten, unused=unused)
                )
            except StorageError as exc:  # the slots run out at their expiry: only later, not wrong
                log.warning("could not settle the slots of limit %s (%s)", key, exc)
        for task in got:  # the claim's own new objects (nobody else holds them): set in place
            task.slot = key
        if from_reserve:  # the claim started these with reserved tokens: as many fewer to ask
            rest = rest[len(got) :]
        return got, rest, False

    async def extend(
        self, now: datetime, worker_id: str, slots: Mapping[str, Mapping[str, datetime]]
    ) -> tuple[set[str], set[str]]:
        """Extend ``worker_id``'s slots ``{limit key: {attempt: new expiry}}`` before their leases
        are renewed. Returns (attempts whose slot is gone: give them up, attempts not confirmed:
        a storage error — do not renew their leases this time)."""
        gone: set[str] = set()
        unknown: set[str] = set()
        for key, extend in slots.items():
            self.commands["extend"] += 1
            try:
                live = set(await self.driver.update_slots(SlotsParams(key, worker_id, now, extend=extend)))
            except StorageError as exc:
                log.warning("could not extend the slots of limit %s (%s)", key, exc)
                unknown |= set(extend)
                continue
            gone |= set(extend) - live
        return gone, unknown

    def give_back_reserve(self) -> None:
        """At stop: the reserved grants go with the last release."""
        for where, grants in self.reserve.items():
            self.releases.setdefault(where, []).extend(a for a, _ in grants)
        self.reserve.clear()

    def release(self, key: str, worker_id: str, attempt: str) -> None:
        """The attempt ended (its outcome written or refused, or its lease lost): its slot is
        released with the next ``flush``."""
        self.releases.setdefault((key, worker_id), []).append(attempt)

    def _hold(self, key: str) -> timedelta:
        """How long the releases of limit ``key`` may wait for the next acquire: as long as a
        reserved grant is kept (half a slot lease) while the limit has room for a reserve (the
        ended slots are no more than the reserve those tasks ran on), ``RELEASE_HOLD`` while it
        is at most half full."""
        return self.slot_lease / 2 if key in self.roomy else self.release_hold

    def _due(self, where: tuple[str, str], now: datetime, everything: bool) -> bool:
        """Whether the releases of (limit, worker) go now, or may wait for that worker's next
        acquire of the limit (``_hold``): they go when the limit was more than half full at the
        last acquire (or is not known), when this Limiter was refused by it (someone waits for
        a slot), and once held that long."""
        if everything or where[0] not in self.ample or where[0] in self.wait_until:
            return True
        return now - self._held_since.setdefault(where, now) >= self._hold(where[0])

    def release_due_in(self, now: datetime) -> float | None:
        """Seconds until a held release is due (0: one is due now); None when none is waiting."""
        if not self.releases:
            return None
        waits = [
            0.0
            if where not in self._held_since or self._due(where, now, False)
            else (self._held_since[where] + self._hold(where[0]) - now).total_seconds()
            for where in self.releases
        ]
        return max(0.0, min(waits))

    def any_due(self, now: datetime) -> bool:
        """Whether ``flush(now)`` has a release to send (else it would return at once)."""
        return any(self._due(where, now, False) for where in self.releases)

    async def flush(self, now: datetime, *, everything: bool = False) -> bool:
        """Release the slots of the attempts that ended (one write per limit and worker), those
        that may not wait for the next acquire (``_due``; ``everything``: all, at stop); on an
        error they are kept for the next flush (and run out at their expiry anyway): False."""
        due = [where for where in self.releases if self._due(where, now, everything)]
        self.commands["release_held"] += sum(
            1
            for where in due
            if not everything and where[0] in self.ample and where[0] not in self.wait_until
        )
        releases = {where: self.releases.pop(where) for where in due}
        for where in due:
            self._held_since.pop(where, None)
        while releases:
            (key, worker_id), attempts = next(iter(releases.items()))
            self.commands["release"] += 1
            try:
                await self.driver.update_slots(SlotsParams(key, worker_id, now, release=attempts))
            except StorageError as exc:
                log.warning("could not release the slots of limit %s (%s)", key, exc)
                for where, a in releases.items():  # this one and the ones not tried yet
                    self.releases.setdefault(where, []).extend(a)
                return False
            del releases[(key, worker_id)]
            if key in self.wait_until:  # refused before (there is work): a slot is free now
                self.wait_until[key] = now
                if self.on_free is not None:
                    self.on_free(key)
        return True
