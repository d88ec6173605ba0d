"""The MongoDriver's own CPU per task (issue 21, item 3): against a stub that answers at once.

The driver runs on a stub of the PyMongo async collection surface it uses (``insert_many``,
``find_one_and_update``, ``update_one``, ``update_many``, ``bulk_write``, ``find``), which does
what PyMongo does with a command on this side of the socket — encodes it to BSON (filter, update
pipeline, sort, projection, documents) — and answers with canned replies shaped as a real server's
(the claimed task's whole document, the ping's projected read, an update's counts), decoded from
BSON as PyMongo would decode them. The round trip is then the only cost left out: what remains is
the driver's CPU (building filters and pipelines, encoding, decoding, converting datetimes) plus
the stub's small bookkeeping. No mongomock: its evaluation of queries would swamp the figure.

A task's life, measured phase by phase over ``--tasks`` tasks (the figures are microseconds of
the process's CPU time per task, per phase the fastest of ``--repeat`` passes, after a warm-up
pass; ``bson``: how much of it the stub's BSON encoding and decoding took, PyMongo's share and the
floor a bare round of the same commands would cost):

* ``publish``: ``insert_tasks`` of 1,000 prepared tasks (``send_many``'s driver part), per task;
* ``claim``: ``claim`` of 8 attempts (``max_parallel_claims``: 8 ``find_one_and_update`` in
  flight), per claimed task;
* ``ping``: one ``ping`` renewing 30 running attempts (a consumer at concurrency 30: one
  ``update_many`` and one read), per attempt — each task pinged once;
* ``finish``: ``finish`` of one outcome (one ``update_one``), per task;
* ``change``: the insert's change-stream event decoded and read (``change_event``), per task;
* ``total``: the sum, one task's life.

``--features``: the same life with the event log on and a flow limit that is never reached
(``max_running`` far above the running tasks), as a consumer drives the driver then: the insert
records its ``sent`` events, each claim batch first acquires its slots (one ``find_one_and_update``
on the limit, carrying the release of the previous batch's ended slots) and buffers a
``claimed`` event per task, each ping group extends its slots first (one write on the limit),
and the ``claimed`` / ``succeeded`` events go in one ``insert_many`` per claim batch (the
consumer's event recorder).

``--profile FILE``: one pass under cProfile, the timed phases only; the stats go to FILE
(``python -m pstats FILE``) and the top functions by own time to stdout.

    PYTHONPATH=/path/to/build python benchmarks/mongo_cpu.py [--tasks 4000] [--repeat 5] [--features]
    python -m benchmarks.mongo_cpu --build start=/work/build-start-21 --build now=. --rounds 3

With ``--build`` each build runs in a fresh process with ``PYTHONPATH=<build>``, alternating
(round 1: every build, round 2: every build, ...); the table gives each build's median per phase
and, per round, its ratio to the first build of the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import pstats
import statistics
import time
from collections.abc import Iterator
from cProfile import Profile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bson
from bson import ObjectId

PHASES = ("publish", "claim", "ping", "finish", "change")
PUBLISH_BATCH = 1000
CLAIM_BATCH = 8
PING_ATTEMPTS = 30
WORKER = "w1"
NAME = "noop"
LIMIT = "bench-limit"


class _Bson:
    """PyMongo's share: the stub's BSON encoding and decoding, kept per phase (``log``) to be
    replayed alone afterwards (``replay``): what a bare round of the same commands over the same
    stub costs, the floor of the driver's CPU."""

    log: list[tuple[bool, Any]] = []

    @classmethod
    def encode(cls, doc: Any) -> bytes:
        cls.log.append((True, doc))
        return bson.encode(doc)

    @classmethod
    def decode(cls, raw: bytes) -> dict[str, Any]:
        cls.log.append((False, raw))
        return bson.decode(raw)

    @staticmethod
    def replay(log: list[tuple[bool, Any]]) -> float:
        """CPU seconds of the log's encodings and decodings alone (the fastest of 3)."""
        encode, decode = bson.encode, bson.decode
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            for is_encode, value in log:
                if is_encode:
                    encode(value)
                else:
                    decode(value)
            best = min(best, time.process_time() - started)
        return best


class _Result:
    """An update's or a bulk write's counts, as PyMongo reports them."""

    def __init__(self, matched: int) -> None:
        self.matched_count = matched
        self.modified_count = matched
        self.upserted_id = None


class _InsertManyResult:
    def __init__(self, ids: list[Any]) -> None:
        self.inserted_ids = ids


class _Cursor:
    """A cursor over canned documents (BSON, decoded as they are read, as PyMongo does)."""

    def __init__(self, raw: list[bytes]) -> None:
        self._raw = raw

    def sort(self, *args: Any, **kwargs: Any) -> _Cursor:
        return self

    def limit(self, n: int) -> _Cursor:
        return self

    def hint(self, index: Any) -> _Cursor:
        return self

    def __aiter__(self) -> _Cursor:
        self._it = iter(self._raw)
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            return _Bson.decode(next(self._it))
        except StopIteration:
            raise StopAsyncIteration from None


class Replies:
    """The canned replies, made before the clock starts: per task its document after the claim,
    per ping group the projected read."""

    def __init__(self) -> None:
        self.claimed: Iterator[bytes] = iter(())
        self.ping_read: dict[str, bytes] = {}
        self.limit: Iterator[bytes] = iter(())  # an acquire's and an extend's replies, in turn


class StubCollection:
    """The PyMongo ``AsyncCollection`` methods the driver's task life uses."""

    def __init__(self, name: str, replies: Replies) -> None:
        self.name = name
        self.replies = replies
        self.database = type("Db", (), {"name": "bench"})()

    def with_options(self, **options: Any) -> StubCollection:
        return self

    async def insert_many(self, docs: list[dict[str, Any]], ordered: bool = True, **kwargs: Any) -> Any:
        ids = []
        for doc in docs:  # PyMongo adds an _id where there is none, then encodes each document
            if "_id" not in doc:
                doc["_id"] = ObjectId()
            ids.append(doc["_id"])
            _Bson.encode(doc)
        return _InsertManyResult(ids)

    async def find_one_and_update(
        self, filter: Any, update: Any, sort: Any = None, hint: Any = None, **kwargs: Any
    ) -> Any:
        command = {"query": filter, "update": update, "new": True}
        if kwargs.get("projection") is not None:
            command["fields"] = kwargs["projection"]
        if sort is not None:
            command["sort"] = dict(sort)
        if hint is not None:
            command["hint"] = hint
        _Bson.encode(command)
        if self.name.endswith("limits"):
            return _Bson.decode(next(self.replies.limit))
        return _Bson.decode(next(self.replies.claimed))

    async def update_one(self, filter: Any, update: Any, **kwargs: Any) -> Any:
        _Bson.encode({"updates": [{"q": filter, "u": update, "multi": False, **kwargs}]})
        return _Result(1)

    async def update_many(self, filter: Any, update: Any, **kwargs: Any) -> Any:
        _Bson.encode({"updates": [{"q": filter, "u": update, "multi": True, **kwargs}]})
        keys = filter.get("key", {}).get("$in", [])
        return _Result(len(keys))

    async def bulk_write(self, requests: list[Any], ordered: bool = True, **kwargs: Any) -> Any:
        for request in requests:
            _Bson.encode({"q": request._filter, "u": request._doc})
        return _Result(len(requests))

    def find(self, filter: Any, projection: Any = None, **kwargs: Any) -> _Cursor:
        _Bson.encode({"filter": filter, "projection": projection or {}})
        keys = filter.get("key", {}).get("$in", [])
        return _Cursor([self.replies.ping_read[k] for k in keys if k in self.replies.ping_read])

    async def find_one(self, filter: Any, *args: Any, **kwargs: Any) -> Any:
        _Bson.encode({"filter": filter})
        return None


class StubDatabase:
    def __init__(self) -> None:
        self.replies = Replies()
        self._collections: dict[str, StubCollection] = {}
        self.name = "bench"

    def __getitem__(self, name: str) -> StubCollection:
        return self._collections.setdefault(name, StubCollection(name, self.replies))


def naive(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None)


def make_driver(features: bool = False) -> tuple[Any, StubDatabase]:
    from mscheduler import MongoDriver

    db = StubDatabase()
    driver = MongoDriver(db, majority=True, create_indexes=False, events=features)
    # builds up to 4dad86a probed the server in setup() and sniffed the collection: set what they
    # would have found on a real server (a later build has none of these attributes: unused there)
    for flag in ("date_arithmetic", "update_hints", "slice_expressions", "reduce_expressions"):
        setattr(driver, flag, True)
    driver.raw_stages = True  # the stub encodes as PyMongo does: it takes BSON stages as they are
    driver._probed = True
    return driver, db


def new_tasks(count: int, start: int, now: datetime) -> list[Any]:
    from mscheduler import Task
    from mscheduler.publishing import prepared_families

    tasks = [Task(f"task-{i}", NAME) for i in range(start, start + count)]
    families = prepared_families(tasks, now=now, reset_finished=False, max_params_bytes=512 * 1024)
    return [t for one in families for t in one]


def claimed_doc(task: Any, attempt: str, now: datetime) -> dict[str, Any]:
    """The task's document as the server returns it after the claim (ReturnDocument.AFTER)."""
    from mscheduler.domain.state import derive
    from mscheduler.drivers.base import new_task_document

    doc = {"_id": task.key} | new_task_document(task, now)
    expire = now + timedelta(seconds=30)
    doc["state"]["worker_states"] = [
        {
            "worker_id": WORKER,
            "attempt": attempt,
            "host": "bench-host",
            "pid": 4242,
            "status": "running",
            "start_time": now,
            "ping_expire_time": expire,
            "end_time": None,
            "retry_at": None,
            "result": None,
            "error": None,
        }
    ]
    doc["state"].update(derive(doc["name"], doc["option"], doc["state"]["worker_states"]))
    return _naive_doc(doc)


def _naive_doc(value: Any) -> Any:
    if isinstance(value, datetime):
        return naive(value)
    if isinstance(value, dict):
        return {k: _naive_doc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_naive_doc(v) for v in value]
    return value


def insert_change(task: Any, now: datetime) -> dict[str, Any]:
    """The insert's event as the change stream's $project hands it over (watch_pipeline)."""
    from mscheduler.domain.state import derive

    state = derive(task.name, task.option, [])
    return _naive_doc(
        {
            "_id": {"_data": "8263A1B2C3000000012B022C0100296E5A1004" + "0" * 30},
            "operationType": "insert",
            "documentKey": {"_id": task.key},
            "ms": {"claimers": [], "partial": False, "stop_partial": False},
            "fullDocument": {
                "key": task.key,
                "name": task.name,
                "option": {"specific_worker_ids": [], "deadline": None},
                "state": {"claim_at": state["claim_at"], "claimers": state["claimers"], "worker_states": []},
            },
        }
    )


def limit_reply(attempts: list[str], expire: datetime) -> bytes:
    """The limit's document as an acquire or an extend projects it back: the asked attempts'
    slots and the summary (a limit far from full: ``max_running`` never reached)."""
    slots = {a: {"w": WORKER, "e": naive(expire), "b": None} for a in attempts}
    return bson.encode({"_id": LIMIT, "slots": slots, "live": 30, "retry_ms": None, "max_running": 1_000_000})


class _Clock:
    def __init__(self, now: datetime) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now


class _Phases:
    """Times the phases (and profiles them, with a profiler): only what is inside is counted. The
    process's CPU time, not the wall clock: on a shared machine a process waits for a core, which
    the wall clock would count."""

    def __init__(self, profiler: Profile | None) -> None:
        self.out: dict[str, float] = {}
        self.logs: dict[str, list[tuple[bool, Any]]] = {}
        self.profiler = profiler
        self._started = 0.0

    def start(self) -> None:
        if self.profiler is not None:
            self.profiler.enable()
        _Bson.log = []
        self._started = time.process_time()

    def stop(self, phase: str) -> None:
        self.out[phase] = time.process_time() - self._started
        if self.profiler is not None:
            self.profiler.disable()
        self.logs[phase] = _Bson.log
        _Bson.log = []

    def replay(self) -> dict[str, float]:
        """The phases' seconds and, as ``<phase>_bson``, their BSON work replayed alone."""
        return self.out | {f"{phase}_bson": _Bson.replay(log) for phase, log in self.logs.items()}


async def measure(tasks: int, features: bool = False, profiler: Profile | None = None) -> dict[str, float]:
    """One pass of every phase over ``tasks`` tasks: seconds per phase."""
    from mscheduler.drivers.base import ClaimParams, FinishParams, InsertParams, PingParams
    from mscheduler.drivers.mongo.common import change_event

    driver, db = make_driver(features)
    now = datetime.now(UTC).replace(microsecond=0)
    prepared = new_tasks(tasks, 0, now)
    attempts = [f"att-{i:06d}" for i in range(tasks)]
    db.replies.claimed = iter(
        [bson.encode(claimed_doc(t, a, now)) for t, a in zip(prepared, attempts, strict=True)]
    )
    expire = now + timedelta(seconds=40)
    for t, a in zip(prepared, attempts, strict=True):
        doc = claimed_doc(t, a, now)
        doc["state"]["worker_states"][0]["ping_expire_time"] = naive(expire)
        read = {
            "_id": doc["_id"],
            "key": doc["key"],
            "option": doc["option"],
            "state": {"worker_states": doc["state"]["worker_states"]},
        }
        db.replies.ping_read[t.key] = bson.encode(read)
    changes = [bson.encode(insert_change(t, now)) for t in prepared]
    slot_expire = now + timedelta(seconds=30)
    if features:
        claims = [attempts[i : i + CLAIM_BATCH] for i in range(0, tasks, CLAIM_BATCH)]
        pings = [attempts[i : i + PING_ATTEMPTS] for i in range(0, tasks, PING_ATTEMPTS)]
        db.replies.limit = iter(
            [limit_reply(batch, slot_expire) for batch in claims]
            + [limit_reply(group, expire) for group in pings]
        )
    recorder = EventRecorderOf(driver, now) if features else None
    phases = _Phases(profiler)
    gc.collect()
    # No full collection in the timed phases: its cost is the whole process's heap (here the
    # harness's prepared tasks and canned replies), not the driver's, and where one falls depends
    # on every allocation before it. The young collections the driver's garbage causes count.
    threshold = gc.get_threshold()
    gc.set_threshold(threshold[0], threshold[1], 1 << 30)

    phases.start()
    for i in range(0, tasks, PUBLISH_BATCH):
        await driver.insert_tasks(InsertParams(prepared[i : i + PUBLISH_BATCH], now))
    phases.stop("publish")

    phases.start()
    claimed = []
    ended: list[str] = []
    for i in range(0, tasks, CLAIM_BATCH):
        batch = attempts[i : i + CLAIM_BATCH]
        if recorder is not None:  # the slots first (the previous batch's ended ones released)
            from mscheduler.drivers.base import AcquireParams

            grant = await driver.acquire_slots(
                AcquireParams(LIMIT, WORKER, batch, now, slot_expire, release=ended)
            )
            assert grant.granted == batch, grant
            ended = batch
        got = await driver.claim(ClaimParams(WORKER, [NAME], now, batch))
        if recorder is not None:
            recorder.claimed(got)
            await recorder.flush()
        claimed += got
    phases.stop("claim")
    assert len(claimed) == tasks, len(claimed)

    phases.start()
    for i in range(0, tasks, PING_ATTEMPTS):
        group = {c.key: c.attempt for c in claimed[i : i + PING_ATTEMPTS]}
        if recorder is not None:  # the slots are extended before the leases
            from mscheduler.drivers.base import SlotsParams

            extend = dict.fromkeys(group.values(), expire)
            live = await driver.update_slots(SlotsParams(LIMIT, WORKER, now, extend=extend))
            assert len(live) == len(group), live
        result = await driver.ping(PingParams(WORKER, now + timedelta(seconds=10), {expire: group}))
        assert len(result.alive) == len(group), result
    phases.stop("ping")

    phases.start()
    for i, c in enumerate(claimed):
        done = await driver.finish(
            [FinishParams(c.key, WORKER, c.attempt, now + timedelta(seconds=1), "succeeded")]
        )
        assert done == [True]
        if recorder is not None:
            recorder.succeeded(c)
            if i % CLAIM_BATCH == CLAIM_BATCH - 1:
                await recorder.flush()
    if recorder is not None:
        await recorder.flush()
    phases.stop("finish")

    phases.start()
    for raw in changes:
        event = change_event(_Bson.decode(raw), None)
        assert event is not None
    phases.stop("change")
    gc.set_threshold(*threshold)
    return phases.replay()


class EventRecorderOf:
    """The consumer's event recorder over ``driver`` (its ``claimed`` and ``succeeded`` events)."""

    def __init__(self, driver: Any, now: datetime) -> None:
        from mscheduler.services.events import EventRecorder

        self.recorder = EventRecorder(driver, _Clock(now))

    def claimed(self, got: list[Any]) -> None:
        from mscheduler.domain.events import EventKind

        for c in got:
            self.recorder.attempt_event(
                EventKind.CLAIMED, c.key, c.name, c.attempt, c.attempt_no, WORKER, None, c.generation
            )

    def succeeded(self, c: Any) -> None:
        from mscheduler.domain.events import EventKind

        self.recorder.attempt_event(
            EventKind.SUCCEEDED, c.key, c.name, c.attempt, c.attempt_no, WORKER, None, c.generation
        )

    async def flush(self) -> None:
        assert await self.recorder.flush()


def run(tasks: int, repeat: int, features: bool = False) -> dict[str, Any]:
    import mscheduler

    asyncio.run(measure(PUBLISH_BATCH, features))  # imports and first-call costs: not counted
    passes = [asyncio.run(measure(tasks, features)) for _ in range(repeat)]
    # the fastest pass per phase: the VM is shared, and a pass another process slowed down
    # measures that process, not the driver
    per_task = {phase: min(p[phase] for p in passes) / tasks * 1e6 for phase in PHASES}
    per_task["total"] = sum(per_task[phase] for phase in PHASES)
    # PyMongo's share: the same BSON work replayed alone, its fastest pass too
    bson_us = {phase: min(p[f"{phase}_bson"] for p in passes) / tasks * 1e6 for phase in PHASES}
    per_task["bson"] = sum(bson_us.values())
    return {
        "mscheduler_file": mscheduler.__file__,
        "tasks": tasks,
        "repeat": repeat,
        "features": features,
        "us_per_task": {k: round(v, 2) for k, v in per_task.items()},
        "bson_us_per_task": {k: round(v, 2) for k, v in bson_us.items()},
    }


def profile(tasks: int, features: bool, path: str) -> None:
    """One pass under cProfile (after a warm-up pass), the timed phases only."""
    asyncio.run(measure(PUBLISH_BATCH, features))
    profiler = Profile()
    asyncio.run(measure(tasks, features, profiler))
    profiler.dump_stats(path)
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(30)


def compare(builds: list[tuple[str, Path]], rounds: int, tasks: int, repeat: int, modes: list[str]) -> None:
    from benchmarks.compare import run_in_build  # the parent only (a run is this file as a script)

    runs = [
        (f"{name}{'' if mode == 'plain' else '+' + mode}", d, mode) for mode in modes for name, d in builds
    ]
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in runs}
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for round_no in range(1, rounds + 1):
        first_total: dict[str, float] = {}
        for name, directory, mode in runs:
            args = [str(Path(__file__).resolve()), "--tasks", str(tasks), "--repeat", str(repeat)]
            if mode == "features":
                args.append("--features")
            result, error = run_in_build(args, directory, 900)
            if result is None:
                print(f"[{round_no}] {name}: failed: {error}")
                continue
            figures = result["us_per_task"]
            rows[name].append(figures)
            first_total.setdefault(mode, figures["total"])
            ratios[name].append(figures["total"] / first_total[mode])
            print(
                f"[{round_no}] {name:<14} " + "  ".join(f"{k} {v:.1f}" for k, v in figures.items()),
                flush=True,
            )
    print()
    print(
        "| build | "
        + " | ".join(f"{p} µs" for p in (*PHASES, "total", "bson"))
        + " | total / first build, per round |"
    )
    print("|---|" + "---|" * (len(PHASES) + 3))
    for name, _, _ in runs:
        if not rows[name]:
            continue
        cells = [
            f"{statistics.median(r[p] for r in rows[name] if p in r):.1f}"
            if any(p in r for r in rows[name])
            else "-"
            for p in (*PHASES, "total", "bson")
        ]
        print(
            f"| {name} | " + " | ".join(cells) + " | " + " / ".join(f"{x:.2f}" for x in ratios[name]) + " |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--features", action="store_true", help="the event log on and a limit never reached")
    parser.add_argument("--profile", metavar="FILE", help="one pass under cProfile, its stats to FILE")
    parser.add_argument("--build", action="append", default=[], help="NAME=DIR (compare builds)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--modes", default="plain", help="with --build: plain, features or plain,features (alternating)"
    )
    args = parser.parse_args()
    if args.build:
        from benchmarks.compare import parse_build  # the parent only (a run is this file as a script)

        modes = args.modes.split(",")
        if not set(modes) <= {"plain", "features"}:
            parser.error("--modes: plain, features or both")
        try:
            builds = [(b.name, b.directory) for b in map(parse_build, args.build)]
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
        compare(builds, args.rounds, args.tasks, args.repeat, modes)
        return
    if args.profile:
        profile(args.tasks, args.features, args.profile)
        return
    print(json.dumps(run(args.tasks, args.repeat, args.features)))


if __name__ == "__main__":
    main()
