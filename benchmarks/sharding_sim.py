"""The sharding simulation (issue 18.10): P in-process "shards" behind a small router.

Each shard is a ``MemoryDriver`` holding one partition's tasks, and a server that serves one
command at a time, each taking ``--service-ms`` (a shard's capacity: what a busy primary is). The
``ShardRouter`` is the store the consumers and the publisher use: it routes every operation by
partition, exactly as the Mongo driver targets its commands (a claim to the partition it names,
``claim_over_parts``; a write about a task to its partition; a batch split per partition; the
expiry passes and the poll to every shard), charges one simulated round trip per shard touched,
and fails any claim or write that would reach a shard holding none of its tasks. Reads that
need every partition (the poll) reach every shard.

Two runs (no change streams: consumers poll, as on a sharded cluster whose stream waits for idle
shards):

* ``scale``: a burn-down of ``--tasks`` no-op tasks spread evenly, ``--consumers`` consumers,
  for P = 1, 2, 4, 8: tasks/s, commands per shard, claims per task, claims that found nothing.
* ``hot``: P = 8, nine tenths of the tasks in partition 0: when each partition's last task
  finished (a starved partition would finish only after the hot one).

Figures are of this process on this machine (one CPU for the whole fleet and every shard): the
throughput grows with the shards until the process's CPU is the limit.

    python -m benchmarks.sharding_sim [--tasks 20000] [--consumers 8] [--service-ms 0.5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from benchmarks.common import TASK_NAME, BurnDown, machine, noop_handler
from mscheduler.domain.model import Task
from mscheduler.domain.partitions import by_part, part_of
from mscheduler.drivers.base import (
    ChangeStreamUnsupported,
    ClaimedTask,
    ClaimParams,
    ClaimStep,
    ExpireParams,
    FinishParams,
    InsertParams,
    LaneParams,
    PingParams,
    PingResult,
    Wakeup,
    WakeupParams,
    claim_over_parts,
)
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.runtime.consumer.consumer import Consumer
from mscheduler.runtime.publisher import Publisher


class TouchedMoreThanOne(AssertionError):
    """A claim or a write would reach a shard that holds none of its tasks."""


class ShardRouter:
    """The store over P shards (see the module). ``commands[i]``: commands served by shard i."""

    def __init__(self, partitions: int, service_ms: float) -> None:
        self.partitions = partitions
        self.shards = [MemoryDriver(partitions=partitions) for _ in range(partitions)]
        self.locks = [asyncio.Lock() for _ in range(partitions)]
        self.service = service_ms / 1000
        self.commands: Counter[int] = Counter()
        self.claims = 0
        self.claims_empty = 0
        self.record_events = False

    async def _on(self, shard: int, operation: Any) -> Any:
        """One command on one shard: queued behind the shard's other commands, then served
        (``operation()`` makes it: nothing is started for a command cancelled while queued)."""
        async with self.locks[shard]:
            self.commands[shard] += 1
            await asyncio.sleep(self.service)
            return await operation()

    def _each(self) -> list[tuple[int, MemoryDriver]]:
        return list(enumerate(self.shards))

    def _only(self, keys: Sequence[str], shard: int) -> None:
        wrong = [k for k in keys if part_of(k, self.partitions) != shard]
        if wrong:
            raise TouchedMoreThanOne(f"shard {shard} asked about {wrong[:3]}")

    # -- what a publisher and a consumer use --------------------------------------------------

    async def setup(self) -> None:
        return None

    async def prepare(self) -> None:
        return None

    async def server_time(self) -> datetime | None:
        return None

    async def insert_tasks(self, params: InsertParams) -> list[bool]:
        created = [False] * len(params.tasks)
        for part, keys in by_part([t.key for t in params.tasks], self.partitions).items():
            wanted = set(keys)
            positions = [i for i, t in enumerate(params.tasks) if t.key in wanted]
            tasks = [params.tasks[i] for i in positions]
            self._only([t.key for t in tasks], part)
            shard_params = replace(params, tasks=tasks)
            done = await self._on(part, lambda s=self.shards[part], p=shard_params: s.insert_tasks(p))
            for i, ok in zip(positions, done, strict=True):
                created[i] = ok
        return created

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        async def claim_round(plan: list[ClaimStep]) -> list[ClaimedTask | BaseException | None]:
            async def one(attempt: str, part: int, lane: str | None) -> ClaimedTask | None:
                self.claims += 1
                shard_params = replace(params, attempts=[attempt], parts=[part], lanes=[lane], exhausted=None)
                got = await self._on(part, lambda: self.shards[part].claim(shard_params))
                if got:
                    self._only([got[0].key], part)
                    return got[0]
                self.claims_empty += 1
                return None

            return list(await asyncio.gather(*(one(*step) for step in plan)))

        claimed, errors, _ = await claim_over_parts(params, self.partitions, claim_round)
        if errors:
            raise errors[0]
        return claimed

    async def ping(self, params: PingParams) -> PingResult:
        result = PingResult()
        keys = [k for group in params.groups.values() for k in group]
        for part, of_part in by_part(keys, self.partitions).items():
            wanted = set(of_part)
            groups = {e: {k: a for k, a in g.items() if k in wanted} for e, g in params.groups.items()}
            shard_params = replace(params, groups=groups)
            one = await self._on(part, lambda s=self.shards[part], p=shard_params: s.ping(p))
            result.alive |= one.alive
            for name in ("lost", "revoked", "cancelled", "paused", "recorded"):
                getattr(result, name).extend(getattr(one, name))
        return result

    async def finish(self, params: Sequence[FinishParams]) -> list[bool]:
        accepted = [False] * len(params)
        for part, keys in by_part([p.key for p in params], self.partitions).items():
            wanted = set(keys)
            positions = [i for i, p in enumerate(params) if p.key in wanted]
            self._only([params[i].key for i in positions], part)
            items = [params[i] for i in positions]
            done = await self._on(part, lambda s=self.shards[part], items=items: s.finish(items))
            for i, ok in zip(positions, done, strict=True):
                accepted[i] = ok
        return accepted

    async def expire_leases(self, params: ExpireParams) -> int:
        return sum(
            [await self._on(i, lambda s=s: s.expire_leases(params)) for i, s in enumerate(self.shards)]
        )

    async def expire_deadlines(self, params: ExpireParams) -> int:
        return sum(
            [await self._on(i, lambda s=s: s.expire_deadlines(params)) for i, s in enumerate(self.shards)]
        )

    async def find_wakeups(self, params: WakeupParams) -> list[Wakeup]:
        found: list[Wakeup] = []
        for i, shard in enumerate(self.shards):  # a read of every partition reaches every shard
            found += await self._on(i, lambda shard=shard: shard.find_wakeups(params))
        claims = sorted((w for w in found if w.kind == "claim"), key=lambda w: w.time)[: params.limit]
        leases = sorted((w for w in found if w.kind == "lease"), key=lambda w: w.time)[:1]
        deadlines = sorted((w for w in found if w.kind == "deadline"), key=lambda w: w.time)[: params.limit]
        return claims + leases + deadlines

    async def find_lanes(self, params: LaneParams) -> list[str]:
        found: set[str] = set()
        for i, shard in enumerate(self.shards):  # a read of every partition reaches every shard
            found.update(await self._on(i, lambda shard=shard: shard.find_lanes(params)))
        return sorted(found)[: params.limit]

    def watch(self, names: Sequence[str], resume_token: Any = None) -> Any:
        async def unsupported() -> Any:
            raise ChangeStreamUnsupported("the simulation's consumers poll")
            yield  # an async generator

        return unsupported()

    # The worker registry, plans and limits are unsharded collections: on the primary shard
    # (shard 0). Task reads and writes are routed above; anything else of a task would fail here.
    UNSHARDED = frozenset(
        {"register_worker", "heartbeat_worker", "unregister_worker", "list_workers", "limit_keys"}
        | {"find_due_plans", "advance_plans", "find_open_parents", "insert_events"}
    )

    def __getattr__(self, name: str) -> Any:
        if name not in self.UNSHARDED:
            raise AttributeError(f"the simulation's router does not route {name!r}")
        target = getattr(self.shards[0], name)

        async def on_primary_shard(*args: Any, **kwargs: Any) -> Any:
            return await self._on(0, lambda: target(*args, **kwargs))

        return on_primary_shard


async def _publish(router: ShardRouter, keys: list[str]) -> None:
    publisher = Publisher(router)
    for start in range(0, len(keys), 1000):
        await publisher.send_many([Task(k, TASK_NAME) for k in keys[start : start + 1000]])


async def _fleet(router: ShardRouter, consumers: int, run: BurnDown) -> list[Consumer]:
    fleet = []
    for i in range(consumers):
        consumer = Consumer(router, worker_id=f"c{i}", concurrency=30, poll_interval=0.05)
        consumer.register(TASK_NAME, noop_handler)
        consumer.add_listener(run.listener)
        fleet.append(consumer)
    return fleet


async def scale(partitions: int, tasks: int, consumers: int, service_ms: float) -> dict[str, Any]:
    router = ShardRouter(partitions, service_ms)
    await _publish(router, [f"task-{i}" for i in range(tasks)])
    router.commands.clear()
    run = BurnDown(expected=tasks)
    fleet = await _fleet(router, consumers, run)
    for consumer in fleet:
        await consumer.start()
    try:
        await asyncio.wait_for(run.done.wait(), timeout=900)
    finally:
        for consumer in fleet:
            await consumer.stop()
    commands = [router.commands[i] for i in range(partitions)]
    return {
        "partitions": partitions,
        "tasks": tasks,
        "tasks_per_s": round(run.rate),
        "commands_per_shard": commands,
        "claims_per_task": round(router.claims / tasks, 3),
        "empty_claims_per_task": round(router.claims_empty / tasks, 3),
        "outcomes": run.outcomes,
    }


async def hot(tasks: int, consumers: int, service_ms: float, partitions: int = 8) -> dict[str, Any]:
    """Nine tenths of the tasks in partition 0: when did each partition's last task finish?"""
    router = ShardRouter(partitions, service_ms)
    hot_keys, cold_keys = [], []
    i = 0
    while len(hot_keys) < tasks * 9 // 10 or len(cold_keys) < tasks // 10:
        key = f"task-{i}"
        i += 1
        if part_of(key, partitions) == 0:
            if len(hot_keys) < tasks * 9 // 10:
                hot_keys.append(key)
        elif len(cold_keys) < tasks // 10:
            cold_keys.append(key)
    await _publish(router, hot_keys + cold_keys)
    finished_at: dict[int, float] = {}
    counts: Counter[int] = Counter()
    run = BurnDown(expected=len(hot_keys) + len(cold_keys))
    start = time.perf_counter()

    def per_partition(event: str, data: dict[str, Any]) -> None:
        if event == "finished":
            part = part_of(data["key"], partitions)
            counts[part] += 1
            finished_at[part] = time.perf_counter() - start

    fleet = await _fleet(router, consumers, run)
    for consumer in fleet:
        consumer.add_listener(per_partition)
        await consumer.start()
    try:
        await asyncio.wait_for(run.done.wait(), timeout=900)
    finally:
        for consumer in fleet:
            await consumer.stop()
    cold_last = max(finished_at[p] for p in range(1, partitions))
    return {
        "partitions": partitions,
        "tasks": len(hot_keys) + len(cold_keys),
        "hot_tasks": len(hot_keys),
        "last_finish_s": {str(p): round(finished_at[p], 2) for p in range(partitions)},
        "cold_all_done_s": round(cold_last, 2),
        "hot_done_s": round(finished_at[0], 2),
        "cold_done_within_share_of_run": round(cold_last / finished_at[0], 3),
        "finished_per_partition": [counts[p] for p in range(partitions)],
    }


async def main(tasks: int, consumers: int, service_ms: float, sizes: list[int]) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(), "service_ms": service_ms, "consumers": consumers}
    results["scale"] = [await scale(p, tasks, consumers, service_ms) for p in sizes]
    results["hot"] = await hot(tasks // 2, consumers, service_ms)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--service-ms", type=float, default=0.5)
    parser.add_argument("--partitions", default="1,2,4,8")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = asyncio.run(
        main(args.tasks, args.consumers, args.service_ms, [int(p) for p in args.partitions.split(",")])
    )
    if args.json:
        print(json.dumps(out))
    else:
        print(f"machine: {out['machine']}")
        print(f"service time per command: {args.service_ms} ms; consumers: {args.consumers}")
        print("| P | tasks/s | commands per shard | claims per task | empty claims per task |")
        print("|---|---|---|---|---|")
        for r in out["scale"]:
            print(
                f"| {r['partitions']} | {r['tasks_per_s']:,} | {r['commands_per_shard']} | "
                f"{r['claims_per_task']} | {r['empty_claims_per_task']} |"
            )
        h = out["hot"]
        print(
            f"hot partition (P=8, {h['hot_tasks']} of {h['tasks']} tasks in partition 0): "
            f"cold partitions all done at {h['cold_all_done_s']} s, the hot one at {h['hot_done_s']} s; "
            f"last finish per partition {h['last_finish_s']}"
        )
