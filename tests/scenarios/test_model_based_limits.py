"""Model-based test of flow limits (SPEC G5): a Hypothesis state machine over the limit protocol.

The lease machine's sibling (``test_model_based.py``; same plumbing: ``FaultyDriver`` per worker over
one shared store, a ``FakeClock``, each step one event). Four workers claim tasks of one limited
name through the consumer's own ``Limiter`` (acquire, claim, settle), ping (slots extended first,
then leases), finish (then release), crash (forget everything, release nothing), lose replies
(one-shot faults before or after the store applied a claim, an acquire, a slot update, a ping or a
finish), and an operator edits the limit (``max_running`` 0..3, a rate of 2..5 per 10 s or none)
while time passes.

Checked after every step, on the store:

* **slots** — live slots (``e > now``) never exceed ``max_running``; after an edit lowers it, they
  never exceed the number live at the edit, and go down to the new value (no slot is granted above
  the current value);
* **leases hold slots** — every live lease (running entry, ``ping_expire_time > now``) has a live
  slot with the same attempt token whose expiry is no earlier than the lease's: a dead holder's
  slot returns only once its lease has run out, and a lease never outlives its slot;
* **rate** — the tasks' stored start times: no window of the rate's period (that starts after the
  rate was last edited) holds more than ``n`` starts;
* **nothing lost** (teardown) — faults off, the limit lifted, every task ends succeeded.

Runs on every layout of ``tests/layouts.py`` (and with the reserve of grants on the memory
driver), with the examples of the run's profile, and fails if a run never reached one of the
paths it exists to check (``PATHS``: a refusal by ``max_running`` or by the rate, a slot given up,
a storage error on a claim, and on a ping or a finish ...).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from bisect import bisect_left
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mscheduler.domain.exceptions import StorageError
from mscheduler.domain.limits import Limit, Rate
from mscheduler.domain.model import TaskOption
from mscheduler.drivers.base import (
    ClaimParams,
    Driver,
    ExpireParams,
    FinishParams,
    InsertParams,
    NewTask,
    PingParams,
    PutLimitParams,
)
from mscheduler.runtime.consumer.limiter import Limiter
from mscheduler.testing.clock import FakeClock
from mscheduler.testing.faults import FaultyDriver
from tests.helpers import as_driver
from tests.layouts import LAYOUTS, MEMORY, Layout, layout_params, search, set_up

WORKERS = ("w0", "w1", "w2", "w3")
NAME = "job"
KEY = "lim"
TASKS = 10
LEASE = timedelta(seconds=5)  # the tasks' worker_timeout
SLOT_LEASE = timedelta(seconds=8)  # the consumers' claim_lease (a slot's first lease)
FAULT_OPS = ("claim", "acquire_slots", "update_slots", "ping", "finish")
_worker = st.sampled_from(WORKERS)
# The arguments of each kind of step.
STEP_ARGS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "claim": st.tuples(_worker, st.integers(1, 3)),
    "ping": st.tuples(_worker),
    "finish": st.tuples(_worker, st.integers(0, 5)),
    "crash": st.tuples(_worker),
    "time_passes": st.tuples(st.sampled_from([0.5, 1, 3, 5, 9]), st.booleans()),  # seconds, expire
    "fault": st.tuples(_worker, st.sampled_from(FAULT_OPS), st.booleans()),  # after_apply
    "edit": st.tuples(
        st.sampled_from([None, 0, 1, 2, 3, 40]),  # max_running (40: room for reserves)
        st.sampled_from([None, (2, 10), (3, 10), (5, 10)]),  # rate
    ),
}
# How often each kind comes up: claims, pings, finishes and time passing are the common events.
STEP_KINDS = (*("claim", "ping", "finish", "time_passes", "fault") * 3, "crash", "edit")


class LimitMachine(RuleBasedStateMachine):
    """``reserve``: Consumer(limit_reserve=...), spare grants kept for the next claims.
    ``paths``: the run's count of the paths each example reached (``PATHS``), added at teardown."""

    def __init__(
        self, layout: Layout = MEMORY, paths: Counter[str] | None = None, reserve: bool = False
    ) -> None:
        super().__init__()
        self.reserve = reserve
        self.paths = paths
        self.stats: Counter[str] = Counter()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.store: Driver = layout.make(self.clock)
        self.run(set_up(self.store))
        self.drivers = {w: FaultyDriver(self.store) for w in WORKERS}
        self.limiters = {w: self.new_limiter(w) for w in WORKERS}
        self.held: dict[str, dict[str, tuple[str, str | None]]] = {w: {} for w in WORKERS}
        self.tokens = itertools.count()
        first = 40 if self.reserve else 2  # 40: room for reserves
        self.max_running: int | None = first
        self.cap = first  # the bound on live slots (see the module doc: lowering edits)
        self.rate: Rate | None = None
        self.rate_since = self.clock.now()
        self.put_limit(first, None)
        # a budget no schedule here uses up (lost leases count): every task must end succeeded
        option = TaskOption(
            worker_timeout=LEASE,
            ping_interval=timedelta(seconds=1),
            retry_delay=timedelta(0),
            max_unexpected_retries=1_000_000,
        )
        stored = option.to_storage(self.clock.now())
        tasks = [NewTask(f"t{i}", NAME, None, stored) for i in range(TASKS)]
        self.run(self.store.insert_tasks(InsertParams(tasks, self.clock.now())))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def new_limiter(self, w: str) -> Limiter:
        return Limiter(
            as_driver(self.drivers[w]),
            refresh=0.001,
            backoff=0.5,
            slot_lease=SLOT_LEASE,
            rng=random.Random(0),
            reserve=self.reserve,
        )

    def put_limit(self, max_running: int | None, rate: Rate | None) -> None:
        limit = Limit(key=KEY, names=(NAME,), max_running=max_running, rate=rate)
        self.run(self.store.put_limit(PutLimitParams(KEY, limit.to_storage(), self.clock.now())))

    def live_slots(self) -> list[dict[str, Any]]:
        doc = self.run(self.store.get_limit(KEY))
        assert doc is not None
        return [s | {"a": a} for a, s in doc["slots"].items() if s["e"] > self.clock.now()]

    def tasks(self) -> list[dict[str, Any]]:
        return [self.run(self.store.get_task(f"t{i}")) for i in range(TASKS)]

    # -- steps ------------------------------------------------------------------------------------

    @rule(kind=st.sampled_from(STEP_KINDS), data=st.data())
    def step(self, kind: str, data: st.DataObject) -> None:
        """Every step goes through this one rule, as in the lease machine: Hypothesis's swarm
        testing turns whole rules off for an example, and a run whose workers never ping, or
        whose faults never land, reaches little. ``STEP_KINDS`` weighs the choices instead."""
        getattr(self, kind)(*data.draw(STEP_ARGS[kind], label=kind))

    def claim(self, w: str, n: int) -> None:
        limiter = self.limiters[w]
        now = self.clock.now()
        self.run(limiter.maybe_refresh([NAME], float(next(self.tokens))))
        limiter.wait_until.clear()  # the machine decides when to ask again
        params = ClaimParams(
            worker_id=w,
            names=[NAME],
            now=now,
            attempts=[f"a{next(self.tokens)}" for _ in range(n)],
            max_lease=SLOT_LEASE,
            exclude_keys=list(self.held[w]),
        )
        refused = limiter.commands["refused"]
        try:
            claimed = self.run(limiter.claim(params, self.drivers[w].claim))
        except StorageError:
            self.stats["claim: storage error"] += 1
            return
        finally:
            if limiter.commands["refused"] > refused:
                self.stats[self.refused_by()] += 1
        for task in claimed:
            self.held[w][task.key] = (task.attempt, task.slot)
        self.stats["claims"] += len(claimed)
        if limiter.reserve:
            self.stats["a worker holds reserved grants"] += 1

    def refused_by(self) -> str:
        """What bound when a claim was refused: ``max_running`` if the live slots reach it."""
        if self.max_running is not None and len(self.live_slots()) >= self.max_running:
            return "refused by max_running"
        return "refused by the rate"

    def ping(self, w: str) -> None:
        if not self.held[w]:
            return
        now = self.clock.now()
        expire = now + LEASE
        slots: dict[str, dict[str, datetime]] = {}
        for _key, (attempt, slot) in self.held[w].items():
            if slot is not None:
                slots.setdefault(slot, {})[attempt] = expire
        gone, unknown = self.run(self.limiters[w].extend(now, w, slots))
        self.stats["slot gone: attempt given up"] += bool(gone)
        renew = {k: a for k, (a, _) in self.held[w].items() if a not in gone | unknown}
        for key in [k for k, (a, _) in self.held[w].items() if a in gone]:
            del self.held[w][key]  # given up, like a lost lease
        if not renew:
            return
        try:
            result = self.run(self.drivers[w].ping(PingParams(w, now, {expire: renew})))
        except StorageError:
            self.stats["ping or finish: storage error"] += 1
            return
        self.stats["lease lost"] += bool(result.lost)
        for key in result.lost:
            attempt, slot = self.held[w].pop(key)
            if slot is not None:
                self.limiters[w].release(slot, w, attempt)

    def finish(self, w: str, i: int) -> None:
        if not self.held[w]:
            return
        key = sorted(self.held[w])[i % len(self.held[w])]
        attempt, slot = self.held[w].pop(key)
        now = self.clock.now()
        try:
            self.run(self.drivers[w].finish([FinishParams(key, w, attempt, now, "succeeded")]))
        except StorageError:
            # outcome unknown: kept and written again later, as the consumer's finisher does (a
            # slot is released only once the outcome is known: written, or refused)
            self.held[w][key] = (attempt, slot)
            self.stats["ping or finish: storage error"] += 1
            return
        if slot is not None:
            self.limiters[w].release(slot, w, attempt)
        self.run(self.limiters[w].flush(now))

    def crash(self, w: str) -> None:
        self.held[w].clear()
        self.limiters[w] = self.new_limiter(w)

    def time_passes(self, seconds: float, expire: bool) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        if expire:
            self.run(self.store.expire_leases(ExpireParams(self.clock.now())))

    def fault(self, w: str, op: str, after_apply: bool) -> None:
        self.drivers[w].fail_next(op, after_apply=after_apply)

    def edit(self, max_running: int | None, rate: tuple[int, int] | None) -> None:
        new_rate = Rate(n=rate[0], period=timedelta(seconds=rate[1])) if rate else None
        if max_running is None and new_rate is None:
            max_running = 1
        # an edit at its own instant: starts stamped before it are told apart from those after
        self.clock.advance(timedelta(milliseconds=1))
        live = len(self.live_slots())
        if max_running is not None and live > max_running:
            self.stats["limit lowered below the live slots"] += 1
        self.put_limit(max_running, new_rate)
        self.max_running = max_running
        self.cap = max(max_running, live) if max_running is not None else 10**9
        if new_rate != self.rate:
            self.rate = new_rate
            self.rate_since = self.clock.now()

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def limits_hold(self) -> None:
        now = self.clock.now()
        live = self.live_slots()
        if self.max_running is not None:
            assert len(live) <= self.cap, f"{len(live)} live slots, max_running {self.max_running}"
            if len(live) <= self.max_running:
                self.cap = self.max_running  # a lowered limit reached: from now on it bounds
        slot_of = {s["a"]: s for s in live}
        docs = self.tasks()
        for doc in docs:
            for entry in doc["state"]["worker_states"]:
                if entry["status"] == "running" and entry["ping_expire_time"] > now:
                    slot = slot_of.get(entry["attempt"])
                    assert slot is not None, f"live lease {entry['attempt']} of {doc['key']} holds no slot"
                    assert slot["e"] >= entry["ping_expire_time"], "a lease outlives its slot"
        if self.rate is not None:
            starts = sorted(
                e["start_time"]
                for doc in docs
                for e in doc["state"]["worker_states"]
                if e["start_time"] >= self.rate_since
            )
            most = max(
                (bisect_left(starts, t + self.rate.period) - i for i, t in enumerate(starts)), default=0
            )
            assert most <= self.rate.n, f"{most} starts in one window, rate {self.rate}"

    def teardown(self) -> None:
        if self.paths is not None:  # the paths the steps reached (not the liveness check below)
            self.paths.update(+self.stats)
        try:
            self.quiesce()
        finally:
            self.loop.close()

    def quiesce(self) -> None:
        for driver in self.drivers.values():
            driver.clear_faults()
        for w in WORKERS:
            self.crash(w)
        self.put_limit(TASKS, None)
        self.max_running = self.cap = TASKS
        self.rate = None
        for _ in range(30):
            if all(doc["state"]["status"] == "succeeded" for doc in self.tasks()):
                return
            self.time_passes(9, True)
            for w in WORKERS:
                self.claim(w, 3)
                while self.held[w]:
                    self.finish(w, 0)
            self.limits_hold()
        stuck = [d["key"] for d in self.tasks() if d["state"]["status"] != "succeeded"]
        assert not stuck, f"tasks never finished: {stuck}"


# The paths each run's search must reach (``LimitMachine.stats``): a generator that drifted away
# from one would leave it unchecked unnoticed.
PATHS = (
    "claims",
    "refused by max_running",
    "refused by the rate",
    "limit lowered below the live slots",
    "slot gone: attempt given up",  # (a lease runs out with its slot: a ping seldom finds it lost)
    "claim: storage error",
    "ping or finish: storage error",
)


@pytest.mark.parametrize("layout", layout_params(LAYOUTS))
def test_limit_model(layout: Layout) -> None:
    """The limit machine on ``layout``, until every path in ``PATHS`` has been reached."""
    search("limit", layout, lambda paths: LimitMachine(layout, paths), PATHS, steps=40)


def test_limit_model_with_reserved_grants() -> None:
    """The same with the consumer's reserve of grants (the limiter alone: the memory driver)."""
    paths = (*PATHS, "a worker holds reserved grants")
    search("reserve", MEMORY, lambda reached: LimitMachine(MEMORY, reached, reserve=True), paths, steps=40)


def test_a_reserved_grant_bounds_the_first_lease() -> None:
    """Pinned: a claim from grants reserved a while ago gives its task a first lease that ends by
    the oldest reserved slot's expiry (not a full slot lease from now)."""
    m = LimitMachine(reserve=True)
    try:
        m.claim("w0", 1)  # learns that the limit has room
        m.claim("w0", 1)  # acquires 4 grants: uses 1, keeps 3
        assert len(m.limiters["w0"].reserve[("lim", "w0")]) == 3
        m.time_passes(3, False)
        m.time_passes(0.5, False)  # 3.5 s: a full worker_timeout (5 s) would outlive the slots
        m.fault("w0", "update_slots", False)  # and no settle write may fix it afterwards
        m.claim("w0", 2)  # from the reserve, no acquire
        assert len(m.held["w0"]) == 4 and len(m.limiters["w0"].reserve[("lim", "w0")]) == 1
        m.limits_hold()
        m.time_passes(1, False)  # the last reserved grant is now older than half a slot lease
        m.claim("w0", 1)  # stale: given back, and a fresh acquire
        m.limits_hold()
        m.teardown()
    finally:
        if not m.loop.is_closed():
            m.loop.close()


def test_a_rate_added_after_grants_were_reserved_counts_them() -> None:
    """Pinned: grants reserved while the limit had no rate are used later without a write; a rate
    set meanwhile counts them (as starts while their slots are held, and when they leave), so
    the starts of one window never exceed it (before issue 18 the reserve's documented gap)."""
    m = LimitMachine(reserve=True)
    try:
        m.claim("w0", 1)  # learns that the limit has room
        m.claim("w0", 1)  # acquires 4 grants: uses 1, keeps 3
        assert len(m.limiters["w0"].reserve[("lim", "w0")]) == 3
        # w0 does not read the limits again before its next claim (within its limits_interval):
        # it cannot know of the rate yet
        m.limiters["w0"].refresh = 3600
        m.edit(40, (2, 10))  # 2 starts per 10 s from now
        m.claim("w0", 2)  # from the reserve, no acquire: 2 starts after the edit
        assert len(m.held["w0"]) == 4
        m.claim("w1", 2)  # an acquire: the window already holds 2 (the reserved grants may start)
        m.limits_hold()
        assert not m.held["w1"]
        m.time_passes(9, False)
        m.claim("w1", 2)
        m.limits_hold()
        m.teardown()
    finally:
        if not m.loop.is_closed():
            m.loop.close()


def test_a_rate_added_while_grants_are_reserved_gives_them_back() -> None:
    """Pinned (found by the reserve machine): grants reserved while the limit had no rate, more of
    them than the rate added later allows in a window. The worker's next read of the limits sees
    the rate and gives the reserve back, so its next claim acquires (and is counted) instead of
    starting three tasks from the reserve (was: 3 starts in one window of a 2/10 s rate)."""
    for max_running in (40, None):
        m = LimitMachine(reserve=True)
        try:
            m.claim("w0", 1)  # learns that the limit has room
            m.claim("w0", 1)  # acquires 4 grants: uses 1, keeps 3
            assert len(m.limiters["w0"].reserve[("lim", "w0")]) == 3
            m.edit(max_running, (2, 10))
            m.claim("w0", 3)
            m.limits_hold()
            assert len(m.held["w0"]) <= 1 + 2 and not m.limiters["w0"].reserve.get(("lim", "w0"))
            m.teardown()
        finally:
            if not m.loop.is_closed():
                m.loop.close()
