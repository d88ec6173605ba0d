"""Request bodies and response shapes of the REST API that the domain does not define itself.

Tasks, options, plans and plan infos are the domain's own models (``TaskInfo``, ``OptionChange``,
``Plan``, ``PlanInfo``): the API validates bodies with them, so no rule is written twice. Every
body here refuses unknown fields (``extra="forbid"``): ``{"$where": ...}`` is a 422, not ignored.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from mscheduler.domain.fairness import KeyWait
from mscheduler.domain.limits import MAX_NAMES, MAX_RUNNING_MAX, LimitInfo
from mscheduler.domain.model import Params, Task, TaskInfo, TaskName, TaskOption
from mscheduler.domain.schedule import PlanTiming
from mscheduler.domain.stats import TaskStats
from mscheduler.operations import MANY_MAX, REASON_MAX, WorkerView


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _iso_text(value: object) -> object:
    """Times are ISO-8601 text only (pydantic would also take 0.5 as a Unix time)."""
    if not isinstance(value, (str, datetime)) or (isinstance(value, str) and not _ISO_DATE.match(value)):
        raise ValueError("an ISO-8601 time with its offset, e.g. 2030-01-01T00:00:00Z")
    return value


_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]")


IsoTime = Annotated[datetime, BeforeValidator(_iso_text)]


class CancelBody(_Body):
    reason: str = Field("", max_length=REASON_MAX, description="why (kept on the task)")


class StatusBody(_Body):
    """A status set by hand (``Operations.set_status``): ``succeeded`` (a step done by hand) or
    ``failed``; recorded on the task with the reason, ``by: "api"`` and the time."""

    status: Literal["succeeded", "failed"]
    reason: str = Field("", max_length=REASON_MAX, description="why (kept on the task)")


class TaskBatchIn(_Body):
    """Many tasks in one request (``Operations.send_many``): checked as a whole first, so one bad
    task refuses the batch (422) and nothing is written."""

    tasks: list[Task] = Field(min_length=1, max_length=MANY_MAX)


def _send_kind(value: Any) -> str:
    return "batch" if isinstance(value, dict) and "tasks" in value else "one"


# ``POST /api/v1/tasks`` takes one task, or ``{"tasks": [...]}``: told apart by the ``tasks`` field
SendIn = Annotated[
    Annotated[Task, Tag("one")] | Annotated[TaskBatchIn, Tag("batch")], Discriminator(_send_kind)
]


class HandlerOut(BaseModel):
    """A task name live workers handle, with the JSON schema of its params (what a send is
    checked against; null: not checked)."""

    name: str
    workers: int = Field(description="live workers (consumers and executors) that handle it")
    params_schema: dict[str, Any] | None = Field(
        description="the JSON schema of its params, as the most recently started worker publishes it"
    )


class SentOut(BaseModel):
    key: str
    created: bool = Field(description="false: a task with this key existed and was left as it is")


class SentManyOut(BaseModel):
    tasks: list[SentOut] = Field(description="one per task sent, in order")


class PlanEdit(_Body):
    """Fields of a plan to change; the ones left out stay as they are."""

    name: TaskName | None = None
    params: Params = None
    option: TaskOption | None = None
    timing: PlanTiming | None = None
    allow_overlap: bool | None = None
    max_consecutive_failures: int | None = Field(None, ge=1, le=1_000_000)


class LimitIn(_Body):
    """A flow limit to create or replace (``Operations.set_limit``): ``max_running``, ``rate`` or
    both; ``names`` default to ``[key]``. A name covered by another limit is refused (422)."""

    # strict: ``"3"`` is not a count, ``true`` not a number (what the schema says, no coercion)
    model_config = ConfigDict(extra="forbid", strict=True)

    names: list[TaskName] | None = Field(
        None, min_length=1, max_length=MAX_NAMES, description="the task names it covers (default: [key])"
    )
    max_running: int | None = Field(
        None,
        ge=0,
        le=MAX_RUNNING_MAX,
        description="attempts running at once across the cluster (0 holds back)",
    )
    rate: str | None = Field(
        None,
        min_length=1,
        max_length=40,
        description='starts per period: "10/s", "1000/h", "5/2m", "100/500ms"',
    )


class LimitHolderOut(BaseModel):
    worker_id: str
    attempt: str
    expire_time: datetime = Field(description="the slot's expiry (renewed with its task's lease)")


class LimitOut(BaseModel):
    """A flow limit as stored, with its live state."""

    key: str
    names: list[str]
    max_running: int | None
    rate: str | None = Field(description='n/period in milliseconds, e.g. "10/1000ms" (PUT takes it back)')
    rate_n: int | None
    rate_period_seconds: float | None
    running: int = Field(description="live slots: attempts of its names running now")
    recent_starts: int = Field(description="starts inside the rate's current window")
    holders: list[LimitHolderOut]
    update_time: datetime | None

    @classmethod
    def of(cls, info: LimitInfo, *, secrets: bool = True) -> LimitOut:
        """``secrets=False`` (a read token): the holders' attempt tokens blanked (``""``)."""
        out = cls.model_validate(info.as_dict())
        if not secrets:
            out.holders = [h.model_copy(update={"attempt": ""}) for h in out.holders]
        return out


class TaskPageOut(BaseModel):
    tasks: list[TaskInfo]
    next_cursor: str | None = Field(
        description="pass it back as ?cursor= with the same filters for the next page; null: last page"
    )
    prev_cursor: str | None = Field(
        None, description="pass it back as ?cursor= for the page before this one; null: the first page"
    )
    total: int | None = Field(
        None, description="with ?with_total=true: how many tasks the filters select (see total_capped)"
    )
    total_capped: bool | None = Field(
        None, description="true: at least total (the count stopped at total_cap)"
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
    groups: list[str] = Field(default_factory=list, description="the worker groups it serves")

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
            groups=list(view.groups),
            live=view.live,
        )


class StopOut(BaseModel):
    worker_id: str
    stop_requested: bool


class StatsOut(BaseModel):
    """Counts by status now; ``details``: the whole of ``Operations.stats()``."""

    counts: dict[str, int] = Field(description="tasks per status (statuses with none are 0)")
    total: int
    details: TaskStats


class KeyWaitsOut(BaseModel):
    """``Operations.key_waits()``: the fairness keys with due tasks, the longest wait first."""

    keys: list[KeyWait]


class WhoAmIOut(BaseModel):
    role: str = Field(
        description="the token's role: admin (reads and changes), read, publish (sends tasks) or executor"
    )
    name: str = Field(description="the token's name: what operator actions record as their author")


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
    field: str | None = Field(
        None, description="invalid_input, where known: the path of the field at fault (params.order_id)"
    )


# -- bulk actions ----------------------------------------------------------------------------------

BulkAction = Literal["cancel", "pause", "resume", "restart", "remove"]


class BulkFilterIn(_Body):
    """The tasks a bulk action applies to: the filters of ``GET /tasks`` (times ISO-8601 with
    their offset). No filter at all: every task."""

    status: str | None = None
    name: str | None = None
    key_prefix: str | None = None
    worker_id: str | None = None
    group: str | None = None
    created_from: IsoTime | None = None
    created_to: IsoTime | None = None
    finished_from: IsoTime | None = None
    finished_to: IsoTime | None = None


class BulkIn(_Body):
    """A bulk action: on ``keys`` (at most 1,000: answered at once, an outcome per key) or on
    every task a ``filter`` selects (run in the background, page by page: 202 and a job to
    follow at ``GET /api/v1/bulk/{id}``). One of the two."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    action: BulkAction
    keys: list[str] | None = Field(None, min_length=1, max_length=1000)
    filter_: BulkFilterIn | None = Field(None, alias="filter")
    reason: str = Field("", max_length=REASON_MAX, description="cancel: why (kept on each task)")
    force: bool = Field(False, description="restart: succeeded tasks too; remove: running ones too")
    stop_running: bool = Field(False, description="pause: also stop the running attempts")


class BulkOutcomeOut(BaseModel):
    key: str
    outcome: Literal["done", "refused", "unknown"] = Field(description="unknown: no such task (any more)")
    status: str | None = Field(None, description="refused: the task's status")
    rule: str | None = Field(None, description="refused: the rule that refused it")


class BulkResultOut(BaseModel):
    action: str
    results: list[BulkOutcomeOut]
    done: int
    refused: int
    unknown: int


class BulkJobOut(BaseModel):
    id: str
    action: str
    filter: dict[str, Any]
    by: str = Field(description="the token that started it")
    state: Literal["running", "done", "stopped", "failed"]
    matched: int = Field(description="tasks the filter selected when it started (see matched_capped)")
    matched_capped: bool = Field(description="true: at least matched (the count stopped at 100,000)")
    processed: int
    done: int
    refused: int
    unknown: int
    started: datetime
    ended: datetime | None
    error: str | None
    results: list[BulkOutcomeOut] = Field(description="outcomes from results_from (the first 10,000 kept)")
    results_total: int = Field(description="outcomes kept")
