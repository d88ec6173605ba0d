"""Steady state, counted: while traffic runs, no in-memory structure grows with the tasks sent.

The short form of ``benchmarks/steady_state.py``: one memory store with the event log on, one
consumer with retention (succeeded tasks kept 5 s, a pass every 5 s), a recurring plan and a flow
limit over a tenth of the tasks, on a ``FakeClock``. Each round sends 200 tasks and moves the
clock one second; every task of a round finishes before the next. After a warm-up long enough
for every time-bounded structure to fill (leases live 30 s, retention keeps 10 s), each
structure's size (``MemoryDriver.structure_sizes``, ``Consumer.structure_sizes``) must stay
within twice its largest warm-up size plus a little, while three times the warm-up's traffic
runs: a structure that keeps an entry per task ever sent (a version per removed key, a heap of
removed keys) fails it. Sizes are counted; nothing is timed.
"""

from __future__ import annotations

from datetime import timedelta

from mscheduler import (
    Consumer,
    EverySchedule,
    FakeClock,
    MemoryDriver,
    Operations,
    Plan,
    PlanTiming,
    Publisher,
    Retention,
    Task,
)
from tests.scenarios.harness import advance, advance_until

PER_ROUND = 100
WARMUP_ROUNDS = 40
ROUNDS = 120
SLACK = 64
KEPT = timedelta(seconds=5)


async def test_structure_sizes_stay_bounded_while_traffic_runs(fake_clock: FakeClock) -> None:
    driver = MemoryDriver(clock=fake_clock, events=True, max_events=5000)
    ops = Operations(driver, clock=fake_clock)
    await ops.set_limit("limited", max_running=10)
    schedule = EverySchedule(interval=timedelta(seconds=1), start=fake_clock.now())
    await ops.add_plan(Plan(plan_id="tick", name="planned", timing=PlanTiming(schedule=schedule)))
    consumer = Consumer(
        driver,
        clock=fake_clock,
        concurrency=30,
        retention=Retention(succeeded=KEPT, failed=KEPT, cancelled=KEPT, expired=KEPT),
        retention_interval=KEPT.total_seconds(),
    )
    finished = {"count": 0}

    def on_event(event: str, data: dict[str, object]) -> None:
        if event == "finished" and data.get("name") != "planned":
            assert data["outcome"] == "succeeded"
            finished["count"] += 1

    async def noop() -> None:
        return None

    for name in ("noop", "limited", "planned"):
        consumer.register(name, noop)
    consumer.add_listener(on_event)
    publisher = Publisher(driver, clock=fake_clock)

    def sizes() -> dict[str, int]:
        store = {f"store.{k}": v for k, v in driver.structure_sizes().items()}
        return store | {f"consumer.{k}": v for k, v in consumer.structure_sizes().items()}

    warmup: dict[str, int] = {}
    grown: dict[str, tuple[int, int]] = {}
    async with consumer:
        for round_no in range(ROUNDS):
            start = round_no * PER_ROUND
            await publisher.send_many(
                [Task(f"t{i}", "limited" if i % 10 == 0 else "noop") for i in range(start, start + PER_ROUND)]
            )
            target = start + PER_ROUND
            await advance_until(fake_clock, lambda: finished["count"] >= target, limit=60)  # noqa: B023
            await advance(fake_clock, 1.0)
            now = sizes()
            if round_no < WARMUP_ROUNDS:
                for name, size in now.items():
                    warmup[name] = max(warmup.get(name, 0), size)
                continue
            for name, size in now.items():
                if size > 2 * warmup.get(name, 0) + SLACK:
                    grown.setdefault(name, (warmup.get(name, 0), size))
            assert now["store.versions"] == now["store.tasks"]  # a removed key keeps no version
            assert now["store.events"] <= driver.max_events
    assert finished["count"] == ROUNDS * PER_ROUND
    assert not grown, f"grew with the traffic (largest warm-up size, size): {grown}"
    assert sizes()["store.tasks"] < 20 * PER_ROUND  # retention keeps about 10 s of them
