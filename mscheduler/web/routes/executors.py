"""Remote executors over HTTP: ``POST /api/v1/executors/lease``, ``/ping`` and
``/report``, for workers that do not speak MongoDB.

Each route calls one ``RemoteExecutors`` method (``mscheduler.remote``), which keeps the Python
consumer's rules: the same claim, the same fenced ping and finish, the same outcome rules. An
executor token (``executor:<token>``) may use these routes and nothing else; an admin token may
too; a read token may not (403). A report or ping of an attempt whose lease moved on changes
nothing: the report answers 409 ``lease_lost`` (an unknown task: 404), the ping says ``lost``.
Task names under a flow limit are leased with the limit's slots, as a consumer claims them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mscheduler.domain.model import GROUP_PREFIX, TaskName, validate_group
from mscheduler.remote.executors import (
    MAX_GROUPS,
    MAX_PINGS,
    MAX_TASKS_PER_LEASE,
    WORKER_ID_MAX,
    AttemptPing,
    AttemptResult,
    RemoteExecutors,
)
from mscheduler.web.auth import Identity
from mscheduler.web.deps import ERROR_ANSWERS, HttpError, Who, bearer, known_query
from mscheduler.web.guards import Slots
from mscheduler.web.models import ErrorOut

WAIT_MAX = 60.0  # seconds a lease request may ask to wait (the service may cut it shorter)


class _Body(BaseModel):
    # strict: ``false`` is not a number, ``"1"`` not a count (what the schema says, no coercion)
    model_config = ConfigDict(extra="forbid", strict=True)


def _not_a_group_token(worker_id: str) -> str:
    if worker_id.startswith(GROUP_PREFIX):
        raise ValueError(f"must not start with {GROUP_PREFIX!r} (a group's claimer token)")
    return worker_id


WorkerId = Annotated[
    str,
    AfterValidator(_not_a_group_token),
    Field(
        min_length=1,
        max_length=WORKER_ID_MAX,
        pattern=r"^[^$\s][^\s]*$",
        description="the executor's id (as a consumer's worker_id: tasks may target it; not "
        "starting with '$' or 'g:', a group's token)",
    ),
]
TaskKey = Annotated[str, Field(min_length=1, max_length=1024)]
GroupName = Annotated[str, AfterValidator(validate_group)]
AttemptToken = Annotated[
    str, Field(min_length=1, max_length=64, description="the attempt token of the lease")
]


class LeaseIn(_Body):
    worker_id: WorkerId
    names: list[TaskName] = Field(min_length=1, max_length=100, description="task names it runs")
    groups: list[GroupName] = Field(
        [], max_length=MAX_GROUPS, description="groups it belongs to: it also takes tasks aimed at them"
    )
    max_tasks: int = Field(1, ge=1, le=MAX_TASKS_PER_LEASE, description="claim at most this many")
    wait_seconds: float = Field(
        0.0, ge=0, le=WAIT_MAX, description="when nothing is due, wait this long for a task (long poll)"
    )
    host: str | None = Field(
        None, min_length=1, max_length=200, description="shown in the worker registry (default: its address)"
    )
    pid: int = Field(0, ge=0, le=2**31 - 1)
    running: int = Field(0, ge=0, le=1_000_000, description="attempts it holds now (worker registry)")


class LeasedTaskOut(BaseModel):
    key: str
    name: str
    params: Any
    attempt: str = Field(description="send it back with every ping and the report")
    attempt_no: int
    lease_expires: datetime = Field(description="ping before this (the store's time)")
    ping_interval_seconds: float = Field(
        description="how often to ping (shorter than the task's when a flow limit capped the first lease)"
    )
    lease_seconds: float = Field(description="the lease a ping renews (the task's worker_timeout)")
    first_lease_seconds: float = Field(
        description="the lease this answer grants: lease_seconds, or less for a name under a flow "
        "limit (capped at the limit slot's lease)"
    )
    run_timeout_seconds: float | None = Field(description="report a failure when the work runs longer")
    checkpoint: Any = Field(description="what an earlier attempt saved (null: nothing)")
    failures: int = Field(description="failures counted before this attempt")


class LeaseOut(BaseModel):
    tasks: list[LeasedTaskOut]
    stop_requested: bool = Field(description="an operator asked this executor to stop: lease no more")


class ProgressIn(_Body):
    fraction: float = Field(ge=0, le=1)
    message: str | None = Field(None, max_length=1000)


class PingItemIn(_Body):
    key: TaskKey
    attempt: AttemptToken
    checkpoint: Any = Field(None, description="save this checkpoint (given, even null: saved)")
    progress: ProgressIn | None = None


class PingIn(_Body):
    worker_id: WorkerId
    tasks: list[PingItemIn] = Field(min_length=1, max_length=MAX_PINGS)
    groups: list[GroupName] | None = Field(
        None,
        max_length=MAX_GROUPS,
        description="its groups (left out: those of its last lease through this server); a task "
        "aimed at groups it is not in is revoked",
    )


class PingItemOut(BaseModel):
    key: str
    attempt: str
    state: Literal["alive", "lost", "revoked", "cancelled", "paused"] = Field(
        description="alive: go on; otherwise stop the work and report nothing (a revoked, "
        "cancelled or paused attempt is settled by the service with this answer)"
    )
    lease_expires: datetime | None
    ping_interval_seconds: float | None
    recorded: bool = Field(description="the checkpoint / progress sent with it was stored")


class PingOut(BaseModel):
    tasks: list[PingItemOut]


class ErrorIn(_Body):
    type: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="stored as reported; left out: Fail (final), Retry (retry_after) or ExecutorError",
    )
    message: str = Field("", max_length=100_000)
    traceback: str | None = Field(None, max_length=1_000_000)


class ReportIn(_Body):
    worker_id: WorkerId
    key: TaskKey
    attempt: AttemptToken
    outcome: Literal["succeeded", "failed", "snoozed", "released"]
    # checked by the consumer's rule (mscheduler.domain.outcomes): one that cannot be stored, or is too
    # large, fails the task for good (``rejected``), as a Python handler's would
    result: Any = Field(None, description="succeeded: the result (stored on the task)")
    error: ErrorIn | None = Field(None, description="failed: what went wrong")
    retry_after: float | None = Field(
        None, ge=0, le=366 * 86400, description="failed: retry after this many seconds; snoozed: required"
    )
    final: bool = Field(False, description="failed: no more retries (Python's Fail)")


class ReportOut(BaseModel):
    key: str
    attempt: str
    status: str = Field(description="what was recorded: succeeded, failed, rejected, snoozed, released")
    retry_at: datetime | None
    final: bool
    error: dict[str, Any] | None = Field(
        description="the stored error (rejected: why the result was refused)"
    )
    duplicate: bool = Field(description="this outcome had been recorded already (a report sent again)")


async def remote(request: Request) -> RemoteExecutors:
    service: RemoteExecutors = request.app.state.executors
    return service


Service = Annotated[RemoteExecutors, Depends(remote)]
_LOST: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "no such task"},
    409: {"model": ErrorOut, "description": "the attempt no longer holds the task (error: lease_lost)"},
}

executors = APIRouter(
    prefix="/executors",
    tags=["executors"],
    dependencies=[Depends(bearer), Depends(known_query)],
    responses=ERROR_ANSWERS,
)


async def _disconnected(request: Request) -> None:
    """Returns when the client has disconnected (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@executors.post("/lease", response_model=LeaseOut, summary="Lease due tasks (long poll)")
async def lease(body: LeaseIn, service: Service, request: Request, who: Who) -> LeaseOut | Response:
    """Claim up to ``max_tasks`` due tasks among ``names`` for ``worker_id`` (the consumer's claim:
    targeting, priority, retry budget); when none is due, wait up to ``wait_seconds`` for one.
    An empty ``tasks`` means nothing came in time: lease again. Names under a flow limit are
    claimed only with a free slot of the limit (``max_running``, ``rate``), shared with every
    consumer and executor; a full limit makes its names wait while the others are leased.
    A bound executor token leases only as its worker ids, names and groups (403); a lease that
    would wait beyond the caps on waits per token or in all, or as one worker id more than a
    token may lease as (``ApiLimits.workers_per_token``), is a 429 with ``Retry-After``."""
    _check_binding(who, body.worker_id, body.names, body.groups)
    retry = str(request.app.state.limits.retry_after_seconds)
    if (refusal := request.app.state.executor_workers.admit(who.name, body.worker_id)) is not None:
        raise HttpError(429, "too_many_workers", refusal, headers={"Retry-After": retry})
    waits: Slots = request.app.state.waits
    waiting = body.wait_seconds > 0
    if waiting and (refusal := waits.acquire(who.name)) is not None:
        raise HttpError(429, "too_many_waits", refusal, headers={"Retry-After": retry})
    leasing = asyncio.ensure_future(
        service.lease(
            body.worker_id,
            body.names,
            max_tasks=body.max_tasks,
            wait=body.wait_seconds,
            host=body.host or (request.client.host if request.client is not None else None),
            pid=body.pid,
            running=body.running,
            groups=body.groups,
        )
    )
    # A long poll whose client goes away stops waiting and claims nothing; a claim whose answer
    # cannot be delivered is given back at once (not left to run out its lease, costing a retry).
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({leasing, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not leasing.done():
            leasing.cancel()  # the service releases what a claim in flight took
            await asyncio.gather(leasing, return_exceptions=True)
            return Response(status_code=499)  # nobody reads it: the client has gone
        got = leasing.result()
        await asyncio.sleep(0)  # a disconnect that came with the answer is seen now
        if gone.done():
            await service.release(body.worker_id, got.tasks)
            return Response(status_code=499)
    finally:
        gone.cancel()
        if not leasing.done():
            leasing.cancel()
        if waiting:
            waits.release(who.name)
    tasks = []
    for task in got.tasks:
        option = task.option
        run_timeout = option.get("run_timeout_ms")
        tasks.append(
            LeasedTaskOut(
                key=task.key,
                name=task.name,
                params=task.params,
                attempt=task.attempt,
                attempt_no=task.attempt_no,
                lease_expires=task.ping_expire_time,
                ping_interval_seconds=got.ping_interval(task),
                lease_seconds=option["worker_timeout_ms"] / 1000,
                first_lease_seconds=got.first_lease(task),
                run_timeout_seconds=run_timeout / 1000 if run_timeout else None,
                checkpoint=task.checkpoint,
                failures=task.fail_cnt,
            )
        )
    return LeaseOut(tasks=tasks, stop_requested=got.stop_requested)


@executors.post("/ping", response_model=PingOut, summary="Renew leases; save checkpoints and progress")
async def ping(body: PingIn, service: Service, who: Who) -> PingOut:
    """One write renews every named attempt's lease (fenced: only this executor's running,
    unexpired attempt), with the checkpoints and progress given. A task whose state is not
    ``alive`` is no longer this executor's: stop working on it."""
    _check_binding(who, body.worker_id, (), body.groups or ())
    items = [
        AttemptPing(
            item.key,
            item.attempt,
            save_checkpoint="checkpoint" in item.model_fields_set,
            checkpoint=item.checkpoint,
            progress=item.progress.model_dump() if item.progress is not None else None,
        )
        for item in body.tasks
    ]
    answers = await service.ping(body.worker_id, items, groups=body.groups)
    return PingOut(
        tasks=[
            PingItemOut(
                key=a.key,
                attempt=a.attempt,
                state=a.state,
                lease_expires=a.lease_expires,
                ping_interval_seconds=a.ping_interval,
                recorded=a.recorded,
            )
            for a in answers
        ]
    )


@executors.post("/report", response_model=ReportOut, responses=_LOST, summary="Report an attempt's outcome")
async def report(body: ReportIn, service: Service, who: Who) -> ReportOut:
    """Record the outcome by the consumer's rules: a failure is retried by the task's retry
    policy (or after ``retry_after``; never with ``final``) while its budget lasts; a result too
    large to store fails the task (``rejected``). 409 when the attempt's lease moved on."""
    _check_binding(who, body.worker_id)
    error = body.error or ErrorIn()  # its type left out: the service's default for the outcome
    done = await service.report(
        body.worker_id,
        body.key,
        body.attempt,
        AttemptResult(
            body.outcome,
            result=body.result,
            error_type=error.type,
            message=error.message,
            traceback=error.traceback,
            retry_after=body.retry_after,
            final=body.final,
        ),
    )
    outcome = done.outcome
    return ReportOut(
        key=done.key,
        attempt=done.attempt,
        status=outcome.status,
        retry_at=outcome.retry_at,
        final=outcome.final,
        error=outcome.error,
        duplicate=done.duplicate,
    )


def _check_binding(
    who: Identity, worker_id: str, names: Sequence[str] = (), groups: Sequence[str] = ()
) -> None:
    """403 when a bound executor token acts as another worker id, name or group (an attempt is
    fenced by its worker id: a token bound to a prefix cannot ping or report others' attempts)."""
    refusal = who.refusal(worker_id, names, groups)
    if refusal is not None:
        raise HttpError(403, "forbidden", refusal)
