"""Fairness between keys and priority aging, simulated on a fake clock.

The simulations are ``benchmarks/flow_sim.py``'s, here at a size that runs in a second (the
benchmark runs key A with 100,000 tasks): four consumers of four handlers, each task taking one
fake second.

* Key A has 2,000 due tasks, keys B-J 10 each. With fairness keys every one of B-J finishes
  within the bound docs/features.md states — a key's n-th task within ``n x K`` claims of the
  fleet (K keys), plus a claim batch per consumer — while A still has most of its backlog;
  without them B-J wait for A's whole backlog. With and without change streams (polling finds
  the lanes too).
* A flood of priority-10 tasks (24 a second, more than the fleet's 16) and one priority-0 task
  sent at 5 s: with ``aging`` of a second per level it starts before any flood task sent later
  than 5 + 10 x 1 s; without aging it has not started after a minute of flood.
"""

from __future__ import annotations

import math

import pytest

from benchmarks.flow_sim import aging, fairness

CONSUMERS, CONCURRENCY, DURATION, POLL = 4, 4, 1.0, 1.0


@pytest.mark.parametrize("streams", [True, False], ids=["change-events", "polling"])
async def test_small_keys_finish_within_the_bound_behind_a_large_backlog(streams: bool) -> None:
    run = await fairness(backlog=2000, consumers=CONSUMERS, concurrency=CONCURRENCY, streams=streams)
    assert sorted(run.finished_at) == list("BCDEFGHIJ")
    assert run.claims_by_then <= run.claim_bound, run.as_dict()
    rounds = math.ceil(run.claim_bound / (CONSUMERS * CONCURRENCY))
    bound = (rounds + 1) * DURATION + POLL
    assert max(run.finished_at.values()) <= bound, run.as_dict()
    assert run.backlog_done_by_then <= 2 * (run.small_tasks + CONCURRENCY) * CONSUMERS, run.as_dict()


async def test_without_fairness_the_small_keys_wait_for_the_backlog() -> None:
    run = await fairness(backlog=2000, consumers=CONSUMERS, concurrency=CONCURRENCY, fair=False)
    assert sorted(run.finished_at) == list("BCDEFGHIJ")
    assert run.backlog_done_by_then >= 2000 - CONSUMERS * CONCURRENCY, run.as_dict()
    assert min(run.finished_at.values()) >= 2000 / (CONSUMERS * CONCURRENCY) * DURATION


async def test_a_low_priority_task_waits_at_most_its_priority_gap_times_the_aging() -> None:
    run = await aging(aging_seconds=1.0, flood_rate=24, low_at=5.0, run_for=120.0)
    assert run.low_started is not None, run.as_dict()
    assert run.latest_flood_send_before_low is not None
    assert run.latest_flood_send_before_low <= 5.0 + 10 * 1.0, run.as_dict()


async def test_without_aging_a_flood_starves_the_low_priority_task() -> None:
    run = await aging(aging_seconds=None, flood_rate=24, low_at=5.0, run_for=60.0)
    assert run.low_started is None, run.as_dict()
    assert run.flood_claimed > 0
