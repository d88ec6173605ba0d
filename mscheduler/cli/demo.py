"""The demo behind ``mscheduler demo``: a mixed batch on several consumers, then checks.

``run_demo(driver)`` publishes quick tasks, tasks that fail and are retried, one that fails for
good, a long task that outlives its first lease only because it pings, tasks aimed at one worker,
and a fan-out task for three workers; runs ``workers`` consumers until every task has ended; then
reads the stored tasks back and checks each path really happened (retries in ``worker_states``,
leases moved by pings, targeting, three distinct fan-out workers). The CLI renders the report
(``report_renderables``) and exits non-zero unless ``DemoReport.ok``.

Durations are short on purpose (retry delays and ping intervals of a few hundred milliseconds) so
the whole run takes a few seconds and every path is exercised.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from mscheduler.cli.common import (
    TIMEOUT_OPTION,
    URI_TIMEOUT_HINT,
    CliError,
    TimeoutMs,
    app,
    database_of,
    ensure_reachable,
    exit_with,
    mongo_client,
    one_line,
    out,
    redact,
    refuse_without,
)
from mscheduler.domain.exceptions import InvalidInput, MSchedulerError
from mscheduler.domain.listing import ListParams
from mscheduler.domain.model import AttemptStatus, Task, TaskInfo, TaskOption, TaskStatus
from mscheduler.domain.plans import Plan, PlanInfo
from mscheduler.domain.schedule import CronSchedule, EverySchedule, PlanTiming
from mscheduler.drivers.base import Driver
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.operations import Operations
from mscheduler.runtime.consumer import Consumer, TaskContext
from mscheduler.runtime.publisher import Publisher

ProgressCallback = Callable[[int, int, dict[str, int]], None]

QUICK, FLAKY, DOOMED, LONG, TARGETED, FANOUT = "quick", "flaky", "doomed", "long", "targeted", "fanout"
KINDS = (QUICK, FLAKY, DOOMED, LONG, TARGETED, FANOUT)
FANOUT_WORKERS = 3


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Sizes and timings of the demo; the defaults finish in about three seconds."""

    workers: int = 4
    concurrency: int = 4
    quick: int = 40
    flaky: int = 6
    targeted: int = 4
    retry_delay: timedelta = timedelta(milliseconds=250)
    max_unexpected_retries: int = 3
    doomed_retries: int = 2  # the doomed task is tried doomed_retries + 1 times
    long_duration: float = 1.6  # seconds; longer than both the claim lease and worker_timeout
    ping_interval: timedelta = timedelta(milliseconds=200)
    worker_timeout: timedelta = timedelta(milliseconds=800)
    claim_lease: timedelta = timedelta(seconds=1)
    poll_interval: float = 0.2
    timeout: float = 60.0  # give up (and fail) if the batch has not ended by then
    seed: int = 7

    def __post_init__(self) -> None:
        if self.workers < FANOUT_WORKERS:
            raise InvalidInput(
                f"the demo needs at least {FANOUT_WORKERS} workers (fan-out to {FANOUT_WORKERS})"
            )
        if self.long_duration <= max(self.claim_lease, self.worker_timeout).total_seconds():
            raise InvalidInput("long_duration must outlast claim_lease and worker_timeout (to show pings)")
        if min(self.quick, self.flaky, self.targeted) < 0 or self.concurrency < 1:
            raise InvalidInput("counts must be >= 0 and concurrency >= 1")


class Work(BaseModel):
    """Params of every demo task: how long to work, and how many first attempts should fail."""

    kind: str
    ms: int = 0
    fail_times: int = 0


@dataclass(slots=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class WorkerStats:
    worker_id: str
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    pings: int = 0


@dataclass(slots=True)
class DemoReport:
    total: int
    expected: dict[str, str]  # key -> expected end status
    tasks: list[TaskInfo]
    workers: list[WorkerStats]
    elapsed: float
    finished_in_time: bool
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def status_counts(self) -> Counter[str]:
        return Counter(t.status.value for t in self.tasks)

    @property
    def expected_counts(self) -> Counter[str]:
        return Counter(self.expected.values())

    @property
    def attempts(self) -> int:
        return sum(len(t.worker_states) for t in self.tasks)


def worker_ids(config: DemoConfig) -> list[str]:
    return [f"demo-worker-{i + 1}" for i in range(config.workers)]


def target_worker(config: DemoConfig) -> str:
    return worker_ids(config)[1]


def kind_of(key: str) -> str:
    return key.split("-", 1)[0]


def build_tasks(config: DemoConfig) -> list[Task]:
    """The batch, in a fixed order; keys start with their kind (``flaky-003``)."""
    rng = random.Random(config.seed)
    retry = {"retry_delay": config.retry_delay, "max_unexpected_retries": config.max_unexpected_retries}
    tasks: list[Task] = []
    for i in range(config.quick):
        tasks.append(Task(f"{QUICK}-{i:03d}", "demo.work", Work(kind=QUICK, ms=rng.randint(10, 120))))
    for i in range(config.flaky):
        fail_times = 1 + i % 2
        params = Work(kind=FLAKY, ms=rng.randint(10, 60), fail_times=fail_times)
        tasks.append(Task(f"{FLAKY}-{i:03d}", "demo.work", params, option=TaskOption(**retry)))
    doomed = TaskOption(retry_delay=config.retry_delay, max_unexpected_retries=config.doomed_retries)
    tasks.append(
        Task(f"{DOOMED}-000", "demo.work", Work(kind=DOOMED, ms=10, fail_times=10**6), option=doomed)
    )
    long_option = TaskOption(ping_interval=config.ping_interval, worker_timeout=config.worker_timeout)
    tasks.append(
        Task(
            f"{LONG}-000",
            "demo.long",
            Work(kind=LONG, ms=int(config.long_duration * 1000)),
            option=long_option,
        )
    )
    aimed = TaskOption(specific_worker_ids=(target_worker(config),))
    for i in range(config.targeted):
        tasks.append(
            Task(
                f"{TARGETED}-{i:03d}", "demo.work", Work(kind=TARGETED, ms=rng.randint(10, 60)), option=aimed
            )
        )
    fanout = TaskOption(concurrent_worker_cnt=FANOUT_WORKERS, priority=10)
    tasks.append(Task(f"{FANOUT}-000", "demo.work", Work(kind=FANOUT, ms=300), option=fanout))
    return tasks


def expected_status(task: Task) -> str:
    return TaskStatus.FAILED.value if kind_of(task.key) == DOOMED else TaskStatus.SUCCEEDED.value


class DemoFailure(RuntimeError):
    """Raised by demo handlers on purpose (retry paths)."""


def make_consumers(driver: Driver, config: DemoConfig) -> list[Consumer]:
    consumers = []
    for worker_id in worker_ids(config):
        consumer = Consumer(
            driver,
            worker_id=worker_id,
            concurrency=config.concurrency,
            poll_interval=config.poll_interval,
            stream_poll_interval=max(config.poll_interval, 1.0),
            heartbeat_interval=1.0,
            grace_period=5.0,
            claim_lease=config.claim_lease,
        )

        @consumer.handler("demo.work")
        async def work(params: Work, ctx: TaskContext) -> dict[str, Any]:
            await asyncio.sleep(params.ms / 1000)
            if ctx.attempt_no <= params.fail_times:
                raise DemoFailure(f"{params.kind} attempt {ctx.attempt_no} fails on purpose")
            return {"worker_id": ctx.worker_id, "attempt_no": ctx.attempt_no}

        @consumer.handler("demo.tick")
        async def tick(params: Any, ctx: TaskContext) -> dict[str, Any]:
            return {"worker_id": ctx.worker_id, "plan": params.get("plan") if params else None}

        @consumer.handler("demo.long")
        async def long(params: Work, ctx: TaskContext) -> dict[str, Any]:
            # Longer than the claim lease and worker_timeout: only the consumer's pings, renewing
            # the lease meanwhile, let this attempt's success be recorded.
            await asyncio.sleep(params.ms / 1000)
            return {"worker_id": ctx.worker_id, "worked_ms": params.ms}

        consumers.append(consumer)
    return consumers


async def run_demo(
    driver: Driver, *, config: DemoConfig | None = None, on_progress: ProgressCallback | None = None
) -> DemoReport:
    """Publish the batch, run the consumers until every task ended (or the timeout), then check."""
    config = config or DemoConfig()
    tasks = build_tasks(config)
    expected = {t.key: expected_status(t) for t in tasks}
    consumers = make_consumers(driver, config)
    pings: Counter[str] = Counter()
    for consumer in consumers:
        consumer.add_listener(_ping_counter(pings, consumer.worker_id))
    publisher = Publisher(driver)
    total = len(tasks)
    started = time.monotonic()
    finished_in_time = False
    for consumer in consumers:
        await consumer.start()
    operations = Operations(driver)
    try:
        for plan in demo_plans(datetime.now(UTC)):
            await operations.add_plan(plan)
        total += PLAN_RUNS
        created = await publisher.send_many(tasks)
        if not all(created):
            raise RuntimeError(
                "the demo store already holds tasks with the demo's keys; use a fresh database"
            )
        deadline = started + config.timeout
        batch = total - PLAN_RUNS
        while True:
            # the progress shows the batch (what the tables count); the plans' runs are a check
            runs = await driver.list_tasks(ListParams(key_prefix="plan:", limit=PLAN_RUNS * 4))
            counts = Counter(await driver.count_by_status())
            counts.subtract(Counter(doc["state"]["status"] for doc in runs))
            ended = (TaskStatus.SUCCEEDED.value, TaskStatus.FAILED.value)
            done = sum(counts.get(status, 0) for status in ended)
            plans_done = sum(doc["state"]["status"] in ended for doc in runs)
            if on_progress is not None:
                on_progress(done, batch, dict(counts))
            if done >= batch and plans_done >= PLAN_RUNS:
                finished_in_time = True
                break
            if time.monotonic() >= deadline or any(c.error is not None for c in consumers):
                break
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        await asyncio.gather(*(c.stop(grace=2.0) for c in consumers))
    docs = await driver.list_tasks(ListParams(limit=total + 10))
    everything = [TaskInfo.from_storage(d) for d in docs]
    plan_runs = sorted((t for t in everything if t.key.startswith("plan:")), key=lambda t: t.key)
    infos = sorted((t for t in everything if not t.key.startswith("plan:")), key=lambda t: t.key)
    stats = [
        WorkerStats(
            c.worker_id,
            claimed=c.stats["claimed"],
            succeeded=c.stats["succeeded"],
            failed=c.stats["failed"] + c.stats["rejected"],
            lost=c.stats["lost"],
            released=c.stats["released"],
            pings=pings[c.worker_id],
        )
        for c in consumers
    ]
    report = DemoReport(total - PLAN_RUNS, expected, infos, stats, elapsed, finished_in_time)
    report.checks = check_report(report, config, [c for c in consumers if c.error is not None])
    report.checks.append(
        _plan_check(plan_runs, [await operations.get_plan(p.plan_id) for p in demo_plans(None)])
    )
    return report


# Two recurring plans fire while the batch runs: every second (3 runs) and a 6-field cron
# expression, every second too (2 runs). Any consumer's planner may make each occurrence.
PLAN_RUNS = 5


def demo_plans(now: datetime | None) -> list[Plan]:
    start = now or datetime(2000, 1, 1, tzinfo=UTC)
    return [
        Plan(
            plan_id="demo-every-second",
            name="demo.tick",
            params={"plan": "every second"},
            timing=PlanTiming(schedule=EverySchedule(interval=timedelta(seconds=1), start=start), repeat=3),
        ),
        Plan(
            plan_id="demo-cron",
            name="demo.tick",
            params={"plan": "cron * * * * * *"},
            timing=PlanTiming(schedule=CronSchedule(expression="* * * * * *"), repeat=2),
        ),
    ]


def _plan_check(runs: list[TaskInfo], plans: list[PlanInfo]) -> Check:
    by_plan = Counter(t.key.split(":")[1] for t in runs if t.status is TaskStatus.SUCCEEDED)
    wanted = {"demo-every-second": 3, "demo-cron": 2}
    ok = dict(by_plan) == wanted and all(p.state == "ended" for p in plans)
    return Check(
        "plans",
        ok,
        ", ".join(f"{plan} fired {by_plan.get(plan, 0)}/{n}" for plan, n in wanted.items())
        + "; "
        + ", ".join(f"{p.plan_id} {p.state}" for p in plans),
    )


def _ping_counter(pings: Counter[str], worker_id: str) -> Callable[[str, dict[str, Any]], None]:
    def listener(event: str, data: dict[str, Any]) -> None:
        if event == "ping":
            pings[worker_id] += 1

    return listener


async def run_demo_on_database(
    database: Any,
    *,
    config: DemoConfig | None = None,
    on_progress: ProgressCallback | None = None,
    keep: bool = False,
) -> tuple[DemoReport, str]:
    """The demo on MongoDB, in collections with a fresh prefix (dropped afterwards unless ``keep``)."""
    prefix = demo_prefix()
    driver = MongoDriver(database, prefix=prefix)
    try:
        await driver.setup()  # its own fresh collections: the demo sets them up (`mscheduler setup`)
        return await run_demo(driver, config=config, on_progress=on_progress), prefix
    finally:
        if not keep:
            await driver.drop()


def _statuses(info: TaskInfo) -> list[str]:
    return [w.status.value for w in info.worker_states]


def check_report(
    report: DemoReport, config: DemoConfig, crashed: list[Consumer] | None = None
) -> list[Check]:
    """Read the stored tasks back and check that every path of the demo really happened."""
    by_key = {t.key: t for t in report.tasks}
    healthy = Check(
        "consumers healthy",
        not crashed,
        "all consumers ran to the end"
        if not crashed
        else f"died: {[(c.worker_id, c.error) for c in crashed]}",
    )
    return [
        healthy,
        _end_states_check(report, config, by_key),
        _retries_check(report),
        _budget_check(config, by_key),
        _pings_check(report, config, by_key),
        _targeting_check(report, config),
        _fan_out_check(by_key),
    ]


def _end_states_check(report: DemoReport, config: DemoConfig, by_key: dict[str, TaskInfo]) -> Check:
    wrong = [
        f"{key}: {by_key[key].status.value if key in by_key else 'missing'} (expected {want})"
        for key, want in report.expected.items()
        if key not in by_key or by_key[key].status.value != want
    ]
    return Check(
        "end states",
        not wrong and report.finished_in_time,
        f"{report.total - len(wrong)}/{report.total} tasks reached their expected end state"
        + ("" if report.finished_in_time else f" (timed out after {config.timeout:.0f}s)")
        + (f"; wrong: {', '.join(wrong[:5])}" if wrong else ""),
    )


def _retries_check(report: DemoReport) -> Check:
    """Each flaky task failed fail_times times, then succeeded, and waited retry_delay."""
    problems = []
    retried = 0
    for info in (t for t in report.tasks if kind_of(t.key) == FLAKY):
        fail_times = Work.model_validate(info.params).fail_times
        statuses = _statuses(info)
        if statuses != ["failed"] * fail_times + ["succeeded"]:
            problems.append(f"{info.key}: {statuses}")
            continue
        retried += fail_times
        for before, after in zip(info.worker_states, info.worker_states[1:], strict=False):
            if before.retry_at is None or after.start_time < before.retry_at:
                problems.append(
                    f"{info.key}: retried at {after.start_time:%H:%M:%S.%f}, before its retry time"
                )
    return Check(
        "retries",
        not problems and retried > 0,
        f"{retried} failed attempts retried, then succeeded" if not problems else "; ".join(problems[:3]),
    )


def _budget_check(config: DemoConfig, by_key: dict[str, TaskInfo]) -> Check:
    doomed = by_key.get(f"{DOOMED}-000")
    tries = config.doomed_retries + 1
    doomed_ok = (
        doomed is not None and _statuses(doomed) == ["failed"] * tries and doomed.last_error is not None
    )
    return Check(
        "retry budget",
        doomed_ok,
        f"{DOOMED}-000 failed for good after {tries} attempts: "
        f"{doomed.last_error.message if doomed and doomed.last_error else '?'}"
        if doomed_ok
        else f"{DOOMED}-000 attempts: {_statuses(doomed) if doomed else 'missing'} (expected {tries} failed)",
    )


def _pings_check(report: DemoReport, config: DemoConfig, by_key: dict[str, TaskInfo]) -> Check:
    """The long task outlived its claim lease and its worker_timeout, so its finish was only
    accepted because pings moved ping_expire_time forward; the stored entry shows it moved."""
    long_task = by_key.get(f"{LONG}-000")
    entry = long_task.worker_states[-1] if long_task and long_task.worker_states else None
    if long_task is None or entry is None or entry.end_time is None:
        return Check("pings", False, f"{LONG}-000 has no finished attempt")
    claim_expiry = entry.start_time + config.claim_lease
    moved = entry.ping_expire_time - claim_expiry
    ran = entry.end_time - entry.start_time
    pings = sum(w.pings for w in report.workers)
    ok = (
        _statuses(long_task) == ["succeeded"]
        and entry.ping_expire_time > claim_expiry
        and ran > config.worker_timeout
        and pings > 0
    )
    return Check(
        "pings",
        ok,
        f"{LONG}-000 ran {ran.total_seconds():.1f}s on one lease; ping_expire_time moved "
        f"{moved.total_seconds():+.1f}s past the claim's expiry ({pings} pings)",
    )


def _targeting_check(report: DemoReport, config: DemoConfig) -> Check:
    target = target_worker(config)
    aimed = [t for t in report.tasks if kind_of(t.key) == TARGETED]
    strays = [f"{t.key}@{w.worker_id}" for t in aimed for w in t.worker_states if w.worker_id != target]
    return Check(
        "targeting",
        bool(aimed) and not strays if config.targeted else not strays,
        f"{len(aimed)} tasks ran only on {target}"
        if not strays
        else f"ran elsewhere: {', '.join(strays[:5])}",
    )


def _fan_out_check(by_key: dict[str, TaskInfo]) -> Check:
    fan = by_key.get(f"{FANOUT}-000")
    fan_workers = (
        sorted({w.worker_id for w in fan.worker_states if w.status is AttemptStatus.SUCCEEDED}) if fan else []
    )
    return Check(
        "fan-out",
        fan is not None and fan.success_cnt == FANOUT_WORKERS and len(fan_workers) == FANOUT_WORKERS,
        f"{FANOUT}-000 ran once on each of {', '.join(fan_workers) or 'no worker'}",
    )


# -- presentation ----------------------------------------------------------------------------------


def report_renderables(report: DemoReport) -> list[RenderableType]:
    """The summary the CLI prints: states, kinds, workers, throughput, checks."""
    states = Table(title="Tasks by state")
    states.add_column("state")
    states.add_column("tasks", justify="right")
    states.add_column("expected", justify="right")
    counts, wanted = report.status_counts, report.expected_counts
    for status in TaskStatus:
        if counts[status.value] or wanted[status.value]:
            states.add_row(status.value, str(counts[status.value]), str(wanted[status.value]))
    states.add_row("total", str(len(report.tasks)), str(report.total), style="bold")

    kinds = Table(title="Tasks by kind")
    for column in ("kind", "tasks", "attempts", "failed attempts", "end state"):
        kinds.add_column(column, justify="left" if column in ("kind", "end state") else "right")
    for kind in KINDS:
        group = [t for t in report.tasks if kind_of(t.key) == kind]
        if not group:
            continue
        attempts = sum(len(t.worker_states) for t in group)
        failed = sum(1 for t in group for w in t.worker_states if w.status is AttemptStatus.FAILED)
        ends = ", ".join(f"{s} {n}" for s, n in sorted(Counter(t.status.value for t in group).items()))
        kinds.add_row(kind, str(len(group)), str(attempts), str(failed), ends)

    workers = Table(title="Workers")
    for column in ("worker", "claimed", "succeeded", "failed", "lost", "released", "pings"):
        workers.add_column(column, justify="left" if column == "worker" else "right")
    for w in report.workers:
        workers.add_row(
            w.worker_id,
            str(w.claimed),
            str(w.succeeded),
            str(w.failed),
            str(w.lost),
            str(w.released),
            str(w.pings),
        )

    elapsed = max(report.elapsed, 1e-9)
    ended = sum(1 for t in report.tasks if t.status.value in (TaskStatus.SUCCEEDED, TaskStatus.FAILED))
    throughput = Text(
        f"{ended} tasks ended in {report.elapsed:.2f}s: {ended / elapsed:.1f} tasks/s, "
        f"{report.attempts} attempts ({report.attempts / elapsed:.1f} attempts/s)"
    )

    checks = Table(title="Checks (read back from the stored worker_states)")
    checks.add_column("check")
    checks.add_column("result")
    checks.add_column("detail")
    for c in report.checks:
        checks.add_row(
            c.name, Text("OK", style="green") if c.ok else Text("FAIL", style="bold red"), c.detail
        )

    verdict = (
        Text(f"demo OK: {report.total} tasks, every one reached its expected end state", style="bold green")
        if report.ok
        else Text("demo FAILED: " + "; ".join(c.name for c in report.checks if not c.ok), style="bold red")
    )
    return [states, kinds, workers, throughput, checks, verdict]


class _FailsOnPurpose(logging.Filter):
    """The demo's doomed task fails for good on purpose: the consumer's warning about it in one
    line, saying so, without the traceback a real failure is logged with."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "error_type", None) == DemoFailure.__name__ and record.levelno >= logging.WARNING:
            record.msg = "task %s (%s) failed for good on attempt %d, as the demo intends: %s: %s"
            record.args = tuple(record.args or ())[:5]
        return True


def demo_prefix() -> str:
    """A fresh collection prefix, so a demo on a shared database never meets another run."""
    return f"demo_{secrets.token_hex(4)}_"


def _run_quietly(report: Coroutine[Any, Any, DemoReport]) -> DemoReport:
    """Run the demo, its handlers' failures on purpose kept out of the consumer's log; a
    refusal is one line and an exit."""
    consumer_log = logging.getLogger("mscheduler.consumer")
    on_purpose = _FailsOnPurpose()
    consumer_log.addFilter(on_purpose)
    try:
        return asyncio.run(report)
    except CliError as exc:
        raise exit_with(exc) from None
    except MSchedulerError as exc:
        raise exit_with(CliError(f"the demo could not run: {one_line(str(exc), limit=300)}")) from None
    finally:
        consumer_log.removeFilter(on_purpose)


def _progress_bar() -> tuple[Progress, Callable[[int, int, dict[str, int]], None]]:
    """The demo's progress bar, and the callback that moves it (done, total, counts by state)."""
    progress = Progress(
        TextColumn("[bold]tasks"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[states]}"),
        TimeElapsedColumn(),
        console=out,
    )
    bar = progress.add_task("tasks", total=None, states="")

    def on_progress(done: int, total: int, counts: dict[str, int]) -> None:
        states = " ".join(f"{state} {n}" for state, n in sorted(counts.items()) if n)
        progress.update(bar, completed=done, total=total, states=states)

    return progress, on_progress


@app.command(short_help="Run a mixed batch on several consumers and check every outcome.")
def demo(
    mongodb_uri: Annotated[
        str | None,
        typer.Option(metavar="URI", help="Run on this MongoDB server instead of in memory."),
    ] = None,
    database: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="Database for --mongodb-uri (default: the URI's, else mscheduler_demo)."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(metavar="N", min=3, help="Consumers to run.")] = 4,
    quick: Annotated[int, typer.Option(metavar="N", min=0, help="Quick tasks in the batch.")] = 40,
    timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS", min=1, help="Fail if the batch has not ended after this many seconds."
        ),
    ] = 60,
    keep: Annotated[
        bool,
        typer.Option("--keep", help="With --mongodb-uri: keep the demo's collections (dropped by default)."),
    ] = False,
    server_selection_timeout_ms: TimeoutMs = None,
) -> None:
    """Publish a mixed batch, run several consumers, and check every task ended as expected.

    Quick tasks, tasks that fail and are retried, one that uses up its retries, a long task kept
    alive by pings, tasks aimed at one worker and a fan-out task for three workers. Exits 1 if any
    check fails, 2 on bad arguments.
    """
    if mongodb_uri is None:
        refuse_without(
            "--mongodb-uri",
            {
                "--database": database is not None,
                "--keep": keep,
                TIMEOUT_OPTION: server_selection_timeout_ms is not None,
            },
            "the demo runs in memory without it",
        )
    config = DemoConfig(workers=workers, quick=quick, timeout=timeout)
    where = "in memory (MemoryDriver)" if mongodb_uri is None else f"on MongoDB {redact(mongodb_uri)}"
    out.print(
        Text.assemble(
            ("mscheduler demo", "bold"), f" {where}: {config.workers} workers x {config.concurrency} slots"
        )
    )
    progress, on_progress = _progress_bar()

    async def on_mongo(uri: str) -> DemoReport:
        client = mongo_client(uri, server_selection_timeout_ms)
        try:
            await ensure_reachable(client, redact(uri), hint=URI_TIMEOUT_HINT)
            db = database_of(client, database, "mscheduler_demo")
            with progress:
                report, prefix = await run_demo_on_database(
                    db, config=config, on_progress=on_progress, keep=keep
                )
            if keep:
                out.print(f"kept collections {db.name}.{prefix}*")
            return report
        finally:
            await client.close()

    async def in_memory() -> DemoReport:
        with progress:
            return await run_demo(MemoryDriver(), config=config, on_progress=on_progress)

    report = _run_quietly(in_memory() if mongodb_uri is None else on_mongo(mongodb_uri))
    for renderable in report_renderables(report):
        out.print(renderable)
    raise typer.Exit(0 if report.ok else 1)
