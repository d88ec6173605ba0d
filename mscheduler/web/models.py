"""Request bodies and response shapes of the REST API that the domain does not define itself.

Tasks, options, plans and plan infos are the domain's own models (``TaskInfo``, ``OptionChange``,
``Plan``, ``PlanInfo``): the API validates bodies with them, so no rule is written twice. Every
body here refuses unknown fields (``extra="forbid"``): ``{"$where": ...}`` is a 422, not ignored.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from mscheduler.model import Params, TaskInfo, TaskName, TaskOption
from mscheduler.operations import REASON_MAX, WorkerView
from mscheduler.schedule import PlanTiming
from mscheduler.stats import TaskStats


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CancelBody(_Body):
    reason: str = Field("", max_length=REASON_MAX, description="why (kept on the task)")


class PlanEdit(_Body):
    """Fields of a plan to change; the ones left out stay as they are."""

    name: TaskName | None = None
    params: Params = None
    option: TaskOption | None = None
    timing: PlanTiming | None = None
    allow_overlap: bool | None = None
    max_consecutive_failures: int | None = Field(None, ge=1, le=1_000_000)


class TaskPageOut(BaseModel):
    tasks: list[TaskInfo]
    next_cursor: str | None = Field(
        description="pass it back as ?cursor= with the same filters for the next page; null: last page"
    )


class WorkerOut(BaseModel):
    worker_id: str
    host: str
    pid: int
    names: list[str]
    concurrency: int
    start_time: datetime
    last_seen: datetime
    running_cnt: int
    stop_requested: bool
    stop_time: datetime | None
    live: bool = Field(description="running, with a recent heartbeat")

    @classmethod
    def of(cls, view: WorkerView) -> WorkerOut:
        return cls(
            worker_id=view.worker_id,
            host=view.host,
            pid=view.pid,
            names=list(view.names),
            concurrency=view.concurrency,
            start_time=view.start_time,
            last_seen=view.last_seen,
            running_cnt=view.running_cnt,
            stop_requested=view.stop_requested,
            stop_time=view.stop_time,
            live=view.live,
        )


class StopOut(BaseModel):
    worker_id: str
    stop_requested: bool


class StatsOut(BaseModel):
    """Counts by status now; ``details``: the whole of ``Operations.stats()`` (SPEC F27)."""

    counts: dict[str, int] = Field(description="tasks per status (statuses with none are 0)")
    total: int
    details: TaskStats


class WhoAmIOut(BaseModel):
    role: str = Field(description="the token's role: admin (reads and changes) or read")


class HealthOut(BaseModel):
    status: str = Field(description='"ok", or "unavailable" (storage failing) with a 503')


class ErrorOut(BaseModel):
    """Every error answer: a machine-readable ``error`` and a sentence for people."""

    error: str = Field(
        description="invalid_input, unauthorized, forbidden, not_found, transition_refused, "
        "lease_lost (a remote executor's attempt no longer holds the task), storage_unavailable "
        "or internal"
    )
    detail: str
    status: str | None = Field(None, description="transition_refused: the task's status")
    rule: str | None = Field(None, description="transition_refused: the rule that refused it")
