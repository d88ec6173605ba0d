"""The soak with every feature on at once (issue 17 E17), on the memory driver with its event log.

50 consumers (each on its own ``FaultyDriver``: claims, pings and finishes fail at random, before
or after they are applied) and 3 HTTP executors (``ExecutorClient`` over the API served in
process) run one store's tasks: plain ones (some fanned out to 2 workers, some saving
checkpoints, some failing), names under a flow limit (``max_running``) and under a rate, tasks
with children (sequential and parallel), and the runs of four plans — one per catch-up policy,
each suspended for a while so that its policy has occurrences to catch up. Operators cancel,
pause (stopping the running attempt or not), resume, restart and edit tasks at random all along;
three consumers are killed and one is frozen past its lease.

Checked every simulated second:

* live leases per task (running, unexpired entries of every generation) <= its
  ``concurrent_worker_cnt``;
* live slots of the capped limit <= its ``max_running``; starts of the rated names in the rate's
  window <= the rate;
* at most one unfinished run of a plan that does not allow overlap.

Checked at the end, once everything is quiet:

* nothing lost: every task ended (succeeded, failed, cancelled, expired);
* every attempt settled: no entry of any generation is still ``running``;
* every plan occurrence made once: each plan's run tasks are exactly ``runs_made``, and ``run_all``
  made every occurrence between its first and last run;
* starts of the rated names in any window of the rate's period, from the stored start times,
  <= the rate;
* the event log: every event a writer that was not killed recorded is stored (none dropped; a
  killed consumer loses what it had buffered, by design), and each task's events are listed in
  the order their writers wrote them (per writer by sequence), ``sent`` first, each attempt's
  ``claimed`` before its outcome.

Size: ``MSCHEDULER_SOAK_SCALE`` (default 1: 4,000 tasks over about 90 simulated seconds, a few
minutes of real time on a loaded 2-core machine; 4 or 10 for a longer run). The figures are
printed at the end; docs/guarantees.md quotes a run.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import random
import time
from collections import Counter, defaultdict
from datetime import timedelta
from typing import Any

import httpx
import pytest

from mscheduler import (
    CatchUp,
    Consumer,
    EverySchedule,
    FakeClock,
    InvalidInput,
    MemoryDriver,
    Operations,
    OptionChange,
    Plan,
    PlanTiming,
    Publisher,
    Task,
    TaskContext,
    TaskOption,
    TransitionRefused,
    UnknownTask,
)
from mscheduler.domain.events import order_key
from mscheduler.drivers.base import EventQuery
from mscheduler.remote.client import ExecutorClient, RemoteTask
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.services.events import EventRecorder
from mscheduler.testing.faults import AFTER_APPLY, FaultyDriver, crash_consumer
from mscheduler.web import ApiTokens, create_app
from tests.helpers import as_driver

SCALE = float(os.environ.get("MSCHEDULER_SOAK_SCALE", "1"))
N_CONSUMERS = 50
N_EXECUTORS = 3
N_TASKS = int(4000 * SCALE)
PUBLISH_FOR = 40.0 * max(SCALE, 1.0)  # simulated seconds over which the tasks are sent
SEED = 20261125
STEP = 0.1
YIELDS = 4
LEASE = timedelta(seconds=4)
MAX_RUNNING = 6
RATE_N = 5  # starts per second of the rated name
KILLED = {"c07": 15.0, "c21": 35.0, "c33": 55.0}
FROZEN, FREEZE_AT, FREEZE_FOR = "c42", 25.0, 8.0  # twice the lease
OPERATOR_ACTIONS_PER_SECOND = 4
PLANS = {
    "p-skip": CatchUp.SKIP,
    "p-once": CatchUp.RUN_ONCE,
    "p-all": CatchUp.RUN_ALL,
    "p-after": CatchUp.AFTER_COMPLETION,
}
PLAN_EVERY = timedelta(seconds=3)
SUSPEND_AT, SUSPEND_FOR = 20.0, 12.0
FAULT_RATES = {
    ("claim", False): 0.01,
    ("claim", True): 0.005,
    ("finish", False): 0.01,
    ("finish", True): 0.005,
    ("ping", False): 0.01,
    ("ping", True): 0.005,
}
TOKEN = "executor-token-soak-0123456789ab"
NAMES = ("job", "capped", "rated", "planned", "step_a", "step_b")
REAL_TIME_LIMIT = 600.0 * max(SCALE, 1.0)

# the kinds an attempt writes (its token is the second part of the event id)
ATTEMPT_KINDS = frozenset({"claimed", "succeeded", "retried", "failed", "rejected", "snoozed", "released"})


class Recorded:
    """Every event a recorder buffers, kept (the writer's own account of what it wrote)."""

    def __init__(self) -> None:
        self.by_writer: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.killed: set[str] = set()

    def attach(self, recorder: EventRecorder | None) -> None:
        if recorder is None:
            return
        record = recorder.record

        def keep(doc: dict[str, Any]) -> None:
            self.by_writer[doc["writer"]].append(doc)
            record(doc)

        recorder.record = keep  # type: ignore[method-assign]


@pytest.mark.soak
@pytest.mark.timeout(int(REAL_TIME_LIMIT) + 120)
async def test_soak_every_feature_at_once() -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    clock = FakeClock()
    store = MemoryDriver(clock=clock, events=True)
    await store.setup()
    ops = Operations(store, clock=clock)
    await ops.set_limit("capped", names=["capped"], max_running=MAX_RUNNING)
    await ops.set_limit("rated", names=["rated"], rate=f"{RATE_N}/s")
    publisher = Publisher(store, clock=clock)
    recorded = Recorded()

    # -- handlers -------------------------------------------------------------------------------
    async def work(key: str, params: dict[str, Any], checkpoint: Any = None, save: Any = None) -> Any:
        duration = params["seconds"]
        if save is not None and params.get("checkpoints"):
            done = (checkpoint or {}).get("done", 0)
            for step in range(done + 1, 4):
                await clock.sleep(duration / 3)
                await save({"done": step})
        else:
            await clock.sleep(duration)
        if params.get("fail") and rng.random() < 0.5:
            raise RuntimeError("random handler failure")
        return {"key": key}

    async def handle(params: Any, ctx: TaskContext) -> Any:
        return await work(ctx.key, params or {"seconds": 0.2}, ctx.checkpoint_data, ctx.checkpoint)

    async def handle_remote(task: RemoteTask) -> Any:
        return await work(task.key, task.params or {"seconds": 0.2}, task.checkpoint_data, task.checkpoint)

    # -- consumers ------------------------------------------------------------------------------
    drivers: dict[str, FaultyDriver] = {}
    consumers: dict[str, Consumer] = {}
    for i in range(N_CONSUMERS):
        worker_id = f"c{i:02d}"
        driver = FaultyDriver(store)
        for (op, after), probability in FAULT_RATES.items():
            driver.fail_randomly(op, probability, after_apply=after, seed=rng.randrange(2**32))
        consumer = Consumer(
            as_driver(driver),
            worker_id=worker_id,
            concurrency=5,
            clock=clock,
            poll_interval=1.0,
            stream_poll_interval=5.0,
            heartbeat_interval=5.0,
            claim_lease=LEASE,
            grace_period=1.0,
            planner=i < 10,  # ten planners race over the plans
            children_interval=2.0,
            limits_interval=1.0,
        )
        for name in NAMES:
            consumer.register(name, handle)
        drivers[worker_id], consumers[worker_id] = driver, consumer
    for consumer in consumers.values():
        await consumer.start()
        recorded.attach(consumer.events)

    # -- executors over HTTP (the API served in process) -----------------------------------------
    service = RemoteExecutors(store, clock=clock, poll_interval=0.5)
    recorded.attach(service.events)
    app = create_app(
        operations=Operations(store, clock=clock), tokens=ApiTokens(executor=[TOKEN]), executors=service
    )
    transport = httpx.ASGITransport(app=app)
    clients = {
        f"ex-{i}": ExecutorClient(
            "http://test",
            TOKEN,
            f"ex-{i}",
            ["job", "capped", "rated"],
            concurrency=3,
            wait_seconds=2,
            transport=transport,
            clock=clock,
        )
        for i in range(N_EXECUTORS)
    }
    runs = {w: asyncio.ensure_future(client.run(handle_remote)) for w, client in clients.items()}

    # -- the tasks and the plans ---------------------------------------------------------------
    normal = TaskOption(
        ping_interval=timedelta(seconds=1), worker_timeout=LEASE, retry_delay=timedelta(seconds=1)
    )
    fan_out = normal.model_copy(update={"concurrent_worker_cnt": 2})
    tasks: list[Task] = []
    for n in range(N_TASKS):
        roll = rng.random()
        seconds = rng.uniform(5, 9) if rng.random() < 0.05 else rng.uniform(0.1, 2.5)
        params = {"seconds": seconds, "fail": rng.random() < 0.15, "checkpoints": rng.random() < 0.2}
        if roll < 0.08:
            mode = "sequential" if rng.random() < 0.5 else "parallel"
            tasks.append(
                Task(
                    f"f{n:05}",
                    "family",
                    params,
                    option=normal,
                    children=["step_a", "step_b"],
                    children_mode=mode,
                )
            )
        elif roll < 0.20:
            tasks.append(Task(f"m{n:05}", "capped", params, option=normal))
        elif roll < 0.30:
            tasks.append(Task(f"r{n:05}", "rated", params | {"seconds": 0.3}, option=normal))
        else:
            option = fan_out if rng.random() < 0.05 else normal
            tasks.append(Task(f"k{n:05}", "job", params, option=option))
    for plan_id, policy in PLANS.items():
        timing = PlanTiming(
            schedule=EverySchedule(interval=PLAN_EVERY, start=clock.now() + PLAN_EVERY),
            catch_up=policy,
            misfire_grace=timedelta(seconds=1),
        )
        await ops.add_plan(Plan(plan_id=plan_id, name="planned", params={"seconds": 0.5}, timing=timing))

    # -- the run --------------------------------------------------------------------------------
    violations: Counter[str] = Counter()
    examples: dict[str, Any] = {}
    peaks = {"live_leases": 0, "capped_slots": 0, "rated_starts": 0}
    operator_done: Counter[str] = Counter()
    paused: set[str] = set()
    sent_keys: list[str] = []
    cancelled: list[str] = []

    def violation(kind: str, example: Any) -> None:
        violations[kind] += 1
        examples.setdefault(kind, example)

    async def check_every_second() -> None:
        now = clock.now()
        unfinished_runs: Counter[str] = Counter()
        for key, doc in store._tasks.items():  # a read-only scan, for the checks only
            state = doc["state"]
            entries = list(state["worker_states"])
            for generation in state.get("history") or ():
                entries += generation["worker_states"]
            live = sum(1 for e in entries if e["status"] == "running" and e["ping_expire_time"] > now)
            peaks["live_leases"] = max(peaks["live_leases"], live)
            if live > doc["option"]["concurrent_worker_cnt"]:
                violation("live leases above concurrent_worker_cnt", (key, live))
            if key.startswith("plan:") and state["status"] in ("pending", "running"):
                unfinished_runs[key.split(":")[1]] += 1
        for plan_id, count in unfinished_runs.items():
            if count > 1:
                violation("overlapping runs of a plan", (plan_id, count))
        capped = await ops.get_limit("capped")
        peaks["capped_slots"] = max(peaks["capped_slots"], capped.running)
        if capped.running > MAX_RUNNING:
            violation("live slots above max_running", capped.holders)
        rated = await ops.get_limit("rated")
        peaks["rated_starts"] = max(peaks["rated_starts"], rated.recent_starts)
        if rated.recent_starts > RATE_N:
            violation("starts above the rate", rated.recent_starts)

    async def cancel_and_restart_a_running_task() -> None:
        """The race of issue 17 A2: a restart right after the cancel of a running task must wait
        until its attempt is settled (within a ping interval), never run it twice at once."""
        running = [
            t for t in await ops.list_tasks(status="running", limit=50) if not t.key.startswith("plan:")
        ]
        if not running:
            return
        key = rng.choice(running).key
        try:
            await ops.cancel(key, "soak operator, restarting")
            cancelled.append(key)
            operator_done["cancel"] += 1
            await ops.restart(key)
            operator_done["restart"] += 1
        except (TransitionRefused, UnknownTask) as exc:
            operator_done["restart waited for a live attempt" if "live lease" in str(exc) else "refused"] += 1

    async def operate() -> None:
        await cancel_and_restart_a_running_task()
        for _ in range(OPERATOR_ACTIONS_PER_SECOND):
            if not sent_keys:
                return
            key = rng.choice(sent_keys[-300:])  # recent ones: most of them still pending or running
            action = rng.choice(["cancel", "pause", "pause_stop", "resume", "restart", "edit"])
            if action == "restart" and cancelled and rng.random() < 0.8:
                key = rng.choice(cancelled)  # often just cancelled: its attempt may still run
            try:
                if action == "cancel":
                    await ops.cancel(key, "soak operator")
                    cancelled.append(key)
                elif action == "pause":
                    await ops.pause(key)
                    paused.add(key)
                elif action == "pause_stop":
                    await ops.pause(key, stop_running=True)
                    paused.add(key)
                elif action == "resume":
                    await ops.resume(key)
                    paused.discard(key)
                elif action == "restart":
                    await ops.restart(key)
                else:
                    await ops.edit(key, OptionChange(priority=rng.randint(0, 5)))
            except (TransitionRefused, UnknownTask, InvalidInput) as exc:
                operator_done[f"{action} refused"] += 1
                if "live lease" in str(exc):
                    operator_done["restart waited for a live attempt"] += 1
                continue
            operator_done[action] += 1

    published = 0
    ticks = 0
    crashes: list[asyncio.Future[None]] = []
    frozen = False
    suspended = resumed = False
    per_tick = max(1, int(N_TASKS / (PUBLISH_FOR / STEP)))
    settle_from: float | None = None
    while True:
        for _ in range(YIELDS):
            await asyncio.sleep(0)
        clock.advance(STEP)
        ticks += 1
        sim = ticks * STEP
        if published < N_TASKS:
            batch = tasks[published : published + per_tick]
            await publisher.send_many(batch)
            published += len(batch)
            sent_keys += [t.key for t in batch]
        for victim, at in KILLED.items():
            if sim >= at and victim not in recorded.killed:
                recorded.killed.add(victim)
                crashes.append(asyncio.ensure_future(crash_consumer(consumers[victim])))
        if not frozen and sim >= FREEZE_AT:
            drivers[FROZEN].freeze()
            frozen = True
        elif frozen and sim >= FREEZE_AT + FREEZE_FOR and drivers[FROZEN].frozen:
            drivers[FROZEN].unfreeze()
        if not suspended and sim >= SUSPEND_AT:
            suspended = True
            for plan_id in PLANS:
                await ops.suspend_plan(plan_id)
        elif suspended and not resumed and sim >= SUSPEND_AT + SUSPEND_FOR:
            resumed = True  # the occurrences missed meanwhile: each plan's policy decides
            for plan_id in PLANS:
                await ops.resume_plan(plan_id)
        if ticks % 10:
            continue
        await check_every_second()
        if settle_from is None:
            await operate()
            if published == N_TASKS and sim >= max(KILLED.values()) + 5:
                settle_from = sim  # the operators stop; the paused tasks run again
                for key in sorted(paused):
                    try:
                        await ops.resume(key)
                    except (TransitionRefused, UnknownTask):
                        pass
                for plan_id in PLANS:  # no new runs: let the last ones end
                    await ops.suspend_plan(plan_id)
        elif not unfinished(store._tasks):
            break
        assert time.monotonic() - started < REAL_TIME_LIMIT, f"soak too slow at {sim:.0f}s: {operator_done}"
    await asyncio.gather(*crashes)
    loop_seconds = time.monotonic() - started

    # -- quiet: stop the survivors (time keeps moving for their last writes) ------------------------
    for client in clients.values():
        client.stop()
    alive = [c for w, c in consumers.items() if w not in recorded.killed]
    stopping = asyncio.ensure_future(asyncio.gather(*(c.stop() for c in alive)))
    while not stopping.done() or not all(run.done() for run in runs.values()):
        await asyncio.sleep(0)
        clock.advance(STEP)
    await stopping
    for run in runs.values():
        run.result()
    await service.aclose()
    for client in clients.values():
        await client.aclose()
    await check_every_second()

    # -- the verdict ------------------------------------------------------------------------------
    docs = {key: doc for key, doc in store._tasks.items()}
    statuses = Counter(doc["state"]["status"] for doc in docs.values())
    lost = unfinished(docs)
    unsettled = []
    attempts = 0
    for key, doc in docs.items():
        entries = list(doc["state"]["worker_states"])
        for generation in doc["state"].get("history") or ():
            entries += generation["worker_states"]
        attempts += len(entries)
        unsettled += [(key, e["attempt"]) for e in entries if e["status"] == "running"]
    attempt_statuses = Counter(
        e["status"]
        for doc in docs.values()
        for e in [
            *doc["state"]["worker_states"],
            *(x for g in doc["state"].get("history") or () for x in g["worker_states"]),
        ]
    )

    # plans: every occurrence made once
    plan_report = {}
    for plan_id in PLANS:
        info = await ops.get_plan(plan_id)
        fires = sorted(k for k in docs if k.startswith(f"plan:{plan_id}:"))
        plan_report[plan_id] = (info.runs_made, len(fires), info.skipped_cnt)
        if info.runs_made != len(fires):
            violation("plan runs not made once each", (plan_id, info.runs_made, len(fires)))
    all_fires = sorted(k for k in docs if k.startswith("plan:p-all:"))
    first, last = all_fires[0].split(":", 2)[2], all_fires[-1].split(":", 2)[2]
    expected = (
        int((docs[all_fires[-1]]["option"]["run_at"] - docs[all_fires[0]]["option"]["run_at"]) / PLAN_EVERY)
        + 1
    )
    if len(all_fires) != expected:
        violation("run_all missed an occurrence", (first, last, len(all_fires), expected))

    # the rate, from the stored start times
    starts = sorted(
        e["start_time"]
        for key, doc in docs.items()
        if doc["name"] == "rated"
        for e in [
            *doc["state"]["worker_states"],
            *(x for g in doc["state"].get("history") or () for x in g["worker_states"]),
        ]
    )
    window = timedelta(seconds=1)
    worst_window = max(
        (bisect.bisect_left(starts, start + window) - i for i, start in enumerate(starts)), default=0
    )
    if worst_window > RATE_N:
        violation("stored starts above the rate", worst_window)

    # the event log: none dropped, each task's events in write order
    stored = await store.list_events(EventQuery(limit=10**9))
    stored_ids = {e["id"] for e in stored}
    store_writer = store.event_writer.id
    dropped = [
        doc["id"]
        for writer, docs_of in recorded.by_writer.items()
        for doc in docs_of
        if doc["id"] not in stored_ids and writer not in killed_writers(consumers, recorded.killed)
    ]
    if dropped:
        violation("recorded events not stored", dropped[:3])
    recorded_count = sum(len(d) for d in recorded.by_writer.values())
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in sorted(stored, key=order_key):
        by_key[event["key"]].append(event)
    for key, story in by_key.items():
        if story[0]["kind"] != "sent":
            violation("a task's story does not start with sent", (key, [e["kind"] for e in story[:3]]))
        # One writer's events keep its order per attempt, and its task-level events keep theirs.
        # Two attempts of one task running side by side in one consumer (concurrent_worker_cnt 2)
        # may end in either order; in one millisecond they are listed by their positions (the
        # documented causal order), not by which ended first.
        last_seq: dict[tuple[str, str | None], int] = {}
        claimed_at: dict[str, int] = {}
        for position, event in enumerate(story):
            writer = event["writer"]
            token = event["id"].split("|")[1] if event["kind"] != "sent" else None
            lane = (writer, token if event["kind"] in ATTEMPT_KINDS else None)
            if event["seq"] <= last_seq.get(lane, 0):
                violation("a writer's events out of order", (key, writer, [e["kind"] for e in story]))
            last_seq[lane] = event["seq"]
            if event["kind"] == "claimed":
                claimed_at[str(token)] = position
            elif event["kind"] in ATTEMPT_KINDS - {"claimed"}:
                if token in claimed_at or event["writer"] == store_writer:
                    continue
                # its claim's event may be lost only with a killed consumer's buffer
                if event["worker_id"] not in recorded.killed:
                    violation("an outcome listed before its claim", (key, [e["kind"] for e in story]))

    print(
        f"\nsoak-all: {N_CONSUMERS} consumers + {N_EXECUTORS} HTTP executors, {N_TASKS} tasks + plan runs, "
        f"{ticks} ticks = {ticks * STEP:.0f}s simulated, {loop_seconds:.1f}s real "
        f"({time.monotonic() - started:.1f}s with shutdown)\n"
        f"soak-all: tasks={len(docs)} statuses={dict(statuses)}\n"
        f"soak-all: attempts={attempts} {dict(attempt_statuses)}\n"
        f"soak-all: operators={dict(sorted(operator_done.items()))}\n"
        f"soak-all: plans (runs_made, runs, skipped)={plan_report}\n"
        f"soak-all: peaks live_leases={peaks['live_leases']} "
        f"capped_slots={peaks['capped_slots']}/{MAX_RUNNING} "
        f"rated_starts_per_window={peaks['rated_starts']}/{RATE_N} stored_worst_window={worst_window}\n"
        f"soak-all: events={len(stored)} (stories of {len(by_key)} tasks; {recorded_count} recorded by "
        f"consumers and the API server, {len(dropped)} of them missing) "
        f"writers={len(recorded.by_writer) + 1} "
        f"killed={sorted(recorded.killed)} frozen={FROZEN} for {FREEZE_FOR:.0f}s "
        f"injected={sum(sum(d.injected.values()) for d in drivers.values())}\n"
        f"soak-all: lost={len(lost)} unsettled={len(unsettled)} violations={dict(violations)}"
    )
    assert not lost, f"{len(lost)} tasks did not end, e.g. {[docs[k]['state'] for k in lost[:2]]}"
    assert not unsettled, f"attempts left running: {unsettled[:5]}"
    assert not violations, f"{dict(violations)}: {examples}"
    assert len(docs) >= N_TASKS and statuses["succeeded"] > N_TASKS // 2
    # the features really ran (a run that exercised nothing would prove nothing)
    assert operator_done["cancel"] and operator_done["pause_stop"] and operator_done["restart"]
    assert operator_done["restart waited for a live attempt"]
    assert attempt_statuses["cancelled"] and attempt_statuses["lost"] and peaks["capped_slots"] == MAX_RUNNING
    assert all(plan_report[p][0] > 0 for p in PLANS) and plan_report["p-skip"][2] > 0
    assert sum(client.stats["reported"] for client in clients.values()) > 0
    assert any(d.injected[("finish", AFTER_APPLY)] for d in drivers.values())


def unfinished(docs: dict[str, dict[str, Any]]) -> list[str]:
    """Tasks not ended. A sequential child blocked behind a sibling that failed (or under a
    cancelled parent) stays pending by design (docs/design.md, "Child tasks"): the parent's end
    is the family's."""
    ended = ("succeeded", "failed", "cancelled", "expired")
    out = []
    for key, doc in docs.items():
        state = doc["state"]
        if state["status"] in ended:
            continue
        parent = docs.get(doc.get("parent") or "")
        if state.get("blocked") and parent is not None and parent["state"]["status"] in ended:
            continue
        out.append(key)
    return out


def killed_writers(consumers: dict[str, Consumer], killed: set[str]) -> set[str]:
    """The event writers of the killed consumers (their buffered events die with them)."""
    recorders = [consumers[w].events for w in killed]
    return {recorder.writer.id for recorder in recorders if recorder is not None}
