"""Recurring plans: what users create (``Plan``), what they read back (``PlanInfo``), and the stored form.

A plan is a task template (name, params, option) plus a ``PlanTiming`` (``mscheduler.domain.schedule``);
planners (``mscheduler.services.planner``) turn its due occurrences into ordinary tasks whose key is
derived from (plan id, fire time): ``plan:<plan id>:<fire time, ISO-8601 UTC, ms>``.

Stored form (one document per plan, in its own collection; both drivers keep it)::

    {plan_id, task: {name, params, option}, timing: {schedule: {kind, ...}, tz, start, end,
     repeat, catch_up, catch_up_cap, misfire_grace_ms}, allow_overlap, max_consecutive_failures,
     suspended, error, awaiting, state, due_time, next_fire_time, runs_made, skipped_cnt,
     skip_next, last_run_key, last_run_fire_time, last_run_status, last_run_seen,
     consecutive_failures, version, create_time, update_time}

``state`` is derived from the flags (``plan_state``); ``due_time`` is when a planner should look
at the plan next (None: no planner reads it); ``version`` grows with every write and is the
compare-and-set value of every update.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import (
    MAX_CHILDREN,
    PLAN_KEY_PREFIX,
    Child,
    OptionChange,
    Params,
    Task,
    TaskName,
    TaskOption,
    children_given,
    has_control,
)
from mscheduler.domain.schedule import (
    AtSchedule,
    CatchUp,
    FrozenModel,
    PlanTiming,
    first_fire_time,
    from_storage_dict,
    to_storage_dict,
    utc_ms,
)

PLAN_ID_MAX_LEN = 200
DEFAULT_MAX_CONSECUTIVE_FAILURES = 3  # seed 003: retry three times, then stop
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TINY = timedelta(microseconds=1)


class PlanState(StrEnum):
    """Where a plan stands (derived from its flags by ``plan_state``)."""

    ACTIVE = "active"  # planners materialise its occurrences when due
    SUSPENDED = "suspended"  # suspended by a user: nothing runs until resumed
    ERROR = "error"  # its runs failed max_consecutive_failures times in a row: parked until resumed
    ENDED = "ended"  # no occurrence will ever be due again (repeat reached, past end, one-off done)
    AWAITING_COMPLETION = "awaiting_completion"  # after_completion: waiting for its run to end


# A planner reads plans in these states when their due_time has come.
PLANNER_STATES = (PlanState.ACTIVE.value, PlanState.AWAITING_COMPLETION.value)


def validate_plan_id(value: object) -> str:
    """A plan id: 1-200 characters, no control character or '|', not starting with '$' (raises
    ValueError)."""
    if not isinstance(value, str) or not value:
        raise ValueError("plan_id must be a non-empty string")
    if len(value) > PLAN_ID_MAX_LEN:
        raise ValueError(f"plan_id is longer than {PLAN_ID_MAX_LEN} characters")
    if has_control(value) or "|" in value or value.startswith("$"):
        raise ValueError("plan_id must not contain control characters or '|', nor start with '$'")
    return value


def occurrence_key(plan_id: str, fire_time: datetime) -> str:
    """The task key of the plan's occurrence at ``fire_time``: the same in every process, so
    the unique key index makes a second task for one occurrence impossible."""
    when = utc_ms(fire_time)
    return f"{PLAN_KEY_PREFIX}{plan_id}:{when.strftime('%Y-%m-%dT%H:%M:%S')}.{when.microsecond // 1000:03d}Z"


_OCCURRENCE_SUFFIX = len(":2000-01-01T00:00:00.000Z")


# A plan's last run whose key a task the plan did not make holds (stored without the plan's
# ``plan_id``): the plan does not take that task for its run, and is parked in the error state
TAKEN_RUN_STATUS = "taken"


def run_status_of(plan_id: str, status: str, maker: str | None) -> str:
    """What a plan records of its run task: the task's status if the plan made it (``maker``, the
    task's stored ``plan_id``), else ``TAKEN_RUN_STATUS``."""
    return status if maker == plan_id else TAKEN_RUN_STATUS


def plan_of_key(key: str) -> str | None:
    """The plan id of an occurrence task's key (``occurrence_key``'s inverse), else None."""
    prefix = len(PLAN_KEY_PREFIX)
    if (
        key.startswith(PLAN_KEY_PREFIX)
        and len(key) > prefix + _OCCURRENCE_SUFFIX
        and key[-_OCCURRENCE_SUFFIX] == ":"
    ):
        return key[prefix:-_OCCURRENCE_SUFFIX]
    return None


def plan_state(*, suspended: bool, error: bool, awaiting: bool, next_fire_time: datetime | None) -> PlanState:
    """The state a plan's flags give (ended wins over error, error over suspended)."""
    if next_fire_time is None and not awaiting:
        return PlanState.ENDED
    if error:
        return PlanState.ERROR
    if suspended:
        return PlanState.SUSPENDED
    if awaiting:
        return PlanState.AWAITING_COMPLETION
    return PlanState.ACTIVE


def refire_time(timing: PlanTiming, now: datetime) -> datetime | None:
    """The next fire time after the timing changed: the first occurrence from now (or ``start``,
    if later); a one-off keeps its instant, so a past one is left to the catch-up policy."""
    if isinstance(timing.schedule, AtSchedule):
        return first_fire_time(timing, now)
    begin = now if timing.start is None or timing.start < now else timing.start
    return timing.next_occurrence(begin - _TINY)


UPCOMING = 5  # fire times PlanInfo.upcoming lists


def upcoming_fire_times(
    timing: PlanTiming, next_fire_time: datetime | None, runs_made: int, n: int = UPCOMING
) -> list[datetime]:
    """The plan's next ``n`` fire times by the schedule's arithmetic, from its stored next fire
    time (skips still to come included: they are passed over when due). After completion, only
    the next one is known (the ones after count from when runs end); none once it ended."""
    if next_fire_time is None:
        return []
    times = [next_fire_time]
    if timing.catch_up is CatchUp.AFTER_COMPLETION:
        return times
    while len(times) < n and (timing.repeat is None or runs_made + len(times) < timing.repeat):
        found = timing.next_occurrence(times[-1])
        if found is None:
            break
        times.append(found)
    return times


def option_to_storage(option: TaskOption) -> dict[str, Any]:
    """A template's option in storage form; ``run_at`` stays unset (each run's is its fire time)."""
    stored = option.to_storage(_EPOCH)
    stored["run_at"] = None
    return stored


class Plan(FrozenModel):
    """A recurring plan, as users create it.

    ``name`` / ``params`` / ``option`` are the template of every run's task; ``timing`` says when
    (``PlanTiming``: schedule, tz, start, end, repeat, catch_up, …). ``max_consecutive_failures``
    runs that failed for good in a row park the plan in the ``error`` state until resumed;
    ``allow_overlap=False`` keeps an occurrence from starting while the previous run is pending or
    running.
    """

    what: ClassVar[str] = "plan"

    plan_id: str
    name: TaskName
    params: Params = None
    option: TaskOption = TaskOption()
    timing: PlanTiming
    suspended: bool = False
    max_consecutive_failures: int = Field(DEFAULT_MAX_CONSECUTIVE_FAILURES, ge=1, le=1_000_000)
    allow_overlap: bool = False
    # each run a task with children (a workflow when they need each other): as ``Task``'s
    children: tuple[Child, ...] | None = Field(None, min_length=1, max_length=MAX_CHILDREN)
    children_mode: Literal["sequential", "parallel", "graph"] | None = None

    @field_validator("children", mode="before")
    @classmethod
    def _children(cls, value: Any) -> Any:
        return children_given(value)

    @model_validator(mode="after")
    def _check_children(self) -> Plan:
        if self.children is not None or self.children_mode is not None:
            # the checks of a task with children, on a key as long as every run's
            run_task(self.plan_id, datetime(2000, 1, 1, tzinfo=UTC), self.task_template())
        return self

    def task_template(self) -> dict[str, Any]:
        """What every run is made of (stored as the plan's ``task``)."""
        template: dict[str, Any] = {
            "name": self.name,
            "params": self.params,
            "option": option_to_storage(self.option),
        }
        if self.children is not None:
            template["children"] = [child_to_storage(c) for c in self.children]
            template["children_mode"] = self.children_mode
        return template

    @field_validator("plan_id")
    @classmethod
    def _check_plan_id(cls, value: str) -> str:
        return validate_plan_id(value)

    @field_validator("option")
    @classmethod
    def _check_option(cls, value: TaskOption) -> TaskOption:
        if value.run_at is not None:
            raise ValueError("run_at must be unset: each run's task is due at its fire time")
        if value.deadline is not None:
            raise ValueError("deadline must be unset: an instant would expire every later run")
        return value

    def to_storage(self, now: datetime) -> dict[str, Any]:
        """The new plan's document (counters at zero, the first fire time computed from ``now``)."""
        now = utc_ms(now)
        next_fire = first_fire_time(self.timing, now)
        state = plan_state(suspended=self.suspended, error=False, awaiting=False, next_fire_time=next_fire)
        return {
            "plan_id": self.plan_id,
            "task": self.task_template(),
            "timing": to_storage_dict(self.timing),
            "allow_overlap": self.allow_overlap,
            "max_consecutive_failures": self.max_consecutive_failures,
            "suspended": self.suspended,
            "error": False,
            "awaiting": False,
            "state": state.value,
            "due_time": next_fire if state is PlanState.ACTIVE else None,
            "next_fire_time": next_fire,
            "runs_made": 0,
            "skipped_cnt": 0,
            "skip_next": 0,
            "last_run_key": None,
            "last_run_fire_time": None,
            "last_run_status": None,
            "last_run_seen": True,
            "consecutive_failures": 0,
            "version": 1,
            "create_time": now,
            "update_time": now,
        }


def timing_from_storage(doc: Mapping[str, Any]) -> PlanTiming:
    """A stored timing back as a ``PlanTiming`` (raises InvalidInput if it was edited badly)."""
    return PlanTiming(**from_storage_dict(doc))


class PlanInfo(BaseModel):
    """A plan as stored, for reading (API, CLI, tests): the definition and the counters."""

    model_config = ConfigDict(frozen=True)

    plan_id: str
    name: str
    params: Any
    option: TaskOption
    timing: PlanTiming
    suspended: bool
    max_consecutive_failures: int
    allow_overlap: bool
    state: PlanState
    next_fire_time: datetime | None = Field(description="the next occurrence a planner will consider")
    runs_made: int
    skipped_cnt: int = Field(description="occurrences passed over (missed under the policy, or skipped)")
    skip_next: int = Field(description="occurrences still to skip")
    last_run_key: str | None = Field(description="the task of the latest run")
    last_run_fire_time: datetime | None
    last_run_status: str | None = Field(description="that task's status, as last seen")
    consecutive_failures: int = Field(description="runs that failed for good in a row")
    create_time: datetime
    update_time: datetime
    version: int
    upcoming: list[datetime] = Field(
        default_factory=list,
        description="the next fire times by the schedule (at most five; skips still count here)",
    )
    children: tuple[Child, ...] | None = None
    children_mode: str | None = None

    def as_plan(self) -> Plan:
        """The definition part, as a ``Plan`` (to edit and re-create)."""
        return Plan(
            plan_id=self.plan_id,
            name=self.name,
            params=self.params,
            option=self.option,
            timing=self.timing,
            suspended=self.suspended,
            max_consecutive_failures=self.max_consecutive_failures,
            allow_overlap=self.allow_overlap,
            children=self.children,
            children_mode=self.children_mode,
        )

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> PlanInfo:
        task = doc["task"]
        return cls(
            plan_id=doc["plan_id"],
            name=task["name"],
            params=task.get("params"),
            option=TaskOption.from_storage(task["option"]),
            timing=timing_from_storage(doc["timing"]),
            suspended=doc["suspended"],
            max_consecutive_failures=doc["max_consecutive_failures"],
            allow_overlap=doc["allow_overlap"],
            state=PlanState(doc["state"]),
            next_fire_time=doc.get("next_fire_time"),
            runs_made=doc["runs_made"],
            skipped_cnt=doc["skipped_cnt"],
            skip_next=doc["skip_next"],
            last_run_key=doc.get("last_run_key"),
            last_run_fire_time=doc.get("last_run_fire_time"),
            last_run_status=doc.get("last_run_status"),
            consecutive_failures=doc["consecutive_failures"],
            create_time=doc["create_time"],
            update_time=doc["update_time"],
            version=doc["version"],
            upcoming=_upcoming_of(doc),
            children=tuple(child_from_storage(c) for c in kids) if (kids := task.get("children")) else None,
            children_mode=task.get("children_mode"),
        )


def child_to_storage(child: Child) -> dict[str, Any]:
    """A plan's child as stored: its fields, its option tagged as a whole option or a change."""
    stored = child.model_dump(mode="json", exclude={"option"}, exclude_defaults=True)
    stored["name"] = child.name
    if isinstance(child.option, TaskOption):
        stored["option"] = {"option": child.option.model_dump(mode="json", exclude_defaults=True)}
    elif isinstance(child.option, OptionChange):
        stored["option"] = {
            "change": child.option.model_dump(mode="json", include=child.option.model_fields_set)
        }
    return stored


def child_from_storage(stored: Mapping[str, Any]) -> Child:
    data = dict(stored)
    option = data.pop("option", None)
    if option is not None:
        data["option"] = (
            TaskOption(**option["option"]) if "option" in option else OptionChange(**option["change"])
        )
    return Child(**data)


def run_task(plan_id: str, fire_time: datetime, template: Mapping[str, Any]) -> Task:
    """The task of a run at ``fire_time``: the template's, keyed by the occurrence (a task with
    children when the template has them). Raises ``InvalidInput`` for a template that is not one."""
    children = [child_from_storage(c) for c in template["children"]] if template.get("children") else None
    return Task(
        occurrence_key(plan_id, fire_time),
        template["name"],
        template.get("params"),
        option=TaskOption.from_storage(template["option"]),
        children=children,
        children_mode=template.get("children_mode"),
    )


def _upcoming_of(doc: Mapping[str, Any]) -> list[datetime]:
    try:
        timing = timing_from_storage(doc["timing"])
    except InvalidInput:  # shown as stored; the planner parks such a plan in the error state
        return []
    return upcoming_fire_times(timing, doc.get("next_fire_time"), doc["runs_made"])


def checked_plan_id(value: object) -> str:
    """``validate_plan_id`` raising InvalidInput naming the field."""
    try:
        return validate_plan_id(value)
    except ValueError as exc:
        raise InvalidInput(f"plan_id: {exc}") from exc
