"""The sharding simulation (benchmarks/sharding_sim.py) runs: a small burn-down on 2 shards and
the hot-partition run, every task done, no claim or write routed to a shard that does not hold
its task (the router raises). Its figures are the benchmark's, not this test's."""

from __future__ import annotations

from benchmarks.sharding_sim import hot, scale


async def test_the_simulation_routes_every_claim_and_write_to_one_shard_and_finishes() -> None:
    result = await scale(2, 300, 2, 0.05)
    assert result["outcomes"] == {"succeeded": 300}
    assert all(n > 0 for n in result["commands_per_shard"])
    skewed = await hot(200, 2, 0.05)
    assert sum(skewed["finished_per_partition"]) == skewed["tasks"]
    assert skewed["finished_per_partition"][0] == skewed["hot_tasks"]
