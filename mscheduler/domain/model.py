"""The task model: what users send (Task, TaskOption) and what they read back (TaskInfo).

Storage shape (both drivers keep it; the Mongo driver is the only place that queries it)::

    {key, name, params,
     option: {priority, concurrent_worker_cnt, specific_worker_ids, ping_interval_ms,
              worker_timeout_ms, max_unexpected_retries, retry_delay_ms, run_at},
     state:  {create_time, update_time, worker_states: [WorkerState...],
              # derived from worker_states + option on every write (see mscheduler.domain.state):
              status, claim_at, free_slots, running_cnt, success_cnt, fail_cnt, retry_at, targeted}}
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from mscheduler.domain.exceptions import InvalidInput, error_reason
from mscheduler.domain.retry import AnyRetryPolicy, FixedRetry, RetryPolicy

KEY_MAX_LEN = 512
# the largest params a task (or a plan, whose every run carries them) may hold, BSON size: a
# task's document also holds its attempts, and MongoDB's limit is 16 MiB per document
DEFAULT_MAX_PARAMS_BYTES = 512 * 1024
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,199}$")
# a fairness key (a tenant, a customer): it becomes part of a claimer token (``name#key|who``),
# so it holds neither ``|`` nor ``#``
_FAIR_KEY_RE = re.compile(r"^[A-Za-z0-9_.:@+=\-]{1,200}$")
# the largest head start aging may give a task (``priority x aging``): its claim order time
# stays a date a store holds
MAX_AGING_SPAN = timedelta(days=366)
PARAMS_MAX_DEPTH = 32


class TaskStatus(StrEnum):
    """A task's state, derived from its worker entries."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"  # its deadline passed before it (re)started: never run late
    CANCELLED = "cancelled"  # an operator cancelled it (``Operations.cancel``)


TERMINAL_STATUSES = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.EXPIRED, TaskStatus.CANCELLED}
)


class AttemptStatus(StrEnum):
    """The state of one worker entry (one attempt)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the handler raised; counts against the retry budget
    LOST = "lost"  # the lease expired (crash, stall); counts against the retry budget
    RELEASED = "released"  # graceful stop gave the slot back; does not count
    REVOKED = "revoked"  # the worker was removed from specific_worker_ids; does not count
    REJECTED = "rejected"  # invalid params: the task fails at once, no retries
    SNOOZED = "snoozed"  # the handler raised Snooze: tried again later, not counted
    # the task was cancelled while the attempt ran: settled by its worker once the handler
    # stopped, or by the lease pass at the lease's end; not counted (nothing failed)
    CANCELLED = "cancelled"


FAILURE_ATTEMPT_STATUSES = frozenset({AttemptStatus.FAILED, AttemptStatus.LOST, AttemptStatus.REJECTED})


def _ms(value: timedelta) -> int:
    return int(value / timedelta(milliseconds=1))


OUT_OF_RANGE = "is out of range: in UTC it would be before year 1 or after year 9999"


def _utc_ms(value: datetime) -> datetime:
    """UTC, cut to milliseconds: what MongoDB stores, so every driver returns the same time. A
    time whose UTC is outside Python's years 1-9999 (year 9999 at -14:00, year 1 at +14:00) is
    a ValueError (refused as bad input), not an OverflowError."""
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        raise ValueError(OUT_OF_RANGE) from None
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _refusal(what: str, fields: Iterable[str], exc: ValidationError) -> str:
    """One line saying which fields were refused and why (pydantic's errors, made readable),
    without the refused values: an answer of the API never echoes its input."""
    reasons = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"])
        message = error_reason(error)
        if error["type"] == "extra_forbidden":
            reasons.append(f"unknown field {field!r} (the fields are {', '.join(fields)})")
            continue
        # the message may name its field already ("key must be a non-empty string")
        named = field and re.search(rf"\b{re.escape(str(error['loc'][-1]))}\b", message)
        reasons.append(message if not field or named else f"{field}: {message}")
    return f"invalid {what}: {'; '.join(reasons)}"


class _UserInput(BaseModel):
    """What users construct: a refused field raises ``InvalidInput`` naming it (not pydantic's
    ``ValidationError``), so every refused input shares one error tree."""

    if not TYPE_CHECKING:  # keep the typed __init__ that the pydantic mypy plugin derives

        def __init__(self, /, **data: Any) -> None:
            try:
                super().__init__(**data)
            except ValidationError as exc:
                raise InvalidInput(_refusal(self._describe(data), type(self).model_fields, exc)) from exc

    @classmethod
    def _describe(cls, data: Mapping[str, Any]) -> str:
        return cls.__name__


# Set while a stored option is read (``TaskOption.from_storage``): rules for new options only are
# not applied (a ContextVar: the model's own __init__ runs its validation, without a context).
_READING_STORED: contextvars.ContextVar[bool] = contextvars.ContextVar("reading_stored", default=False)


@contextlib.contextmanager
def reading_stored() -> Iterator[None]:
    """Within it, models are read from storage: rules for new input only are not applied."""
    reading = _READING_STORED.set(True)
    try:
        yield
    finally:
        _READING_STORED.reset(reading)


# ``TaskOption.to_storage``'s run-independent part per option object (most tasks share one, the
# default), by id; each entry holds its option, so that id is not reused while it is kept
_STORED_OPTIONS: dict[int, tuple[TaskOption, dict[str, Any]]] = {}
_STORED_OPTIONS_MAX = 1024


class TaskOption(_UserInput):
    """How a task is run. Options are apart from the payload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priority: int = Field(0, ge=-1_000_000, le=1_000_000, description="higher is claimed first")
    concurrent_worker_cnt: int = Field(1, ge=1, le=10_000, description="distinct workers that run it")
    specific_worker_ids: tuple[str, ...] = Field((), max_length=1000, description="[] = any worker")
    specific_groups: tuple[str, ...] = Field(
        (), max_length=100, description="groups whose members may run it too ([] with no worker ids: anyone)"
    )
    same_worker_may_repeat: bool = Field(
        False,
        description="a worker may take it again after its run, until concurrent_worker_cnt runs succeeded",
    )
    ping_interval: timedelta = Field(timedelta(seconds=10), description="how often a runner pings")
    worker_timeout: timedelta = Field(timedelta(seconds=30), description="lease length after a ping")
    max_unexpected_retries: int | None = Field(
        3, ge=0, le=1_000_000, description="failures tolerated (None: unlimited, with a retry policy)"
    )
    retry_delay: timedelta = Field(timedelta(seconds=10), description="wait after a failure")
    retry: AnyRetryPolicy | None = Field(
        None,
        description="a retry policy; None: fixed retry_delay x max_unexpected_retries",
    )
    run_at: datetime | None = Field(None, description="not claimed before this time (UTC)")
    deadline: datetime | None = Field(None, description="not started after this time: it ends expired")
    run_timeout: timedelta | None = Field(
        None, description="an attempt running longer is cancelled and fails"
    )
    fair_key: str | None = Field(
        None,
        description="a fairness key (a tenant): among due tasks of one priority, claims rotate across keys",
    )
    aging: timedelta | None = Field(
        None, description="a waiting task gains one priority level per this much wait (priority >= 0)"
    )

    @model_validator(mode="before")
    @classmethod
    def _budget_from_policy(cls, data: Any) -> Any:
        """With a retry policy, ``max_unexpected_retries`` is its budget (set it, or leave it)."""
        if isinstance(data, Mapping) and data.get("retry") is not None:
            policy = data["retry"]
            if not isinstance(policy, RetryPolicy):
                from mscheduler.domain.retry import parse_retry_policy

                policy = parse_retry_policy(policy)
            data = dict(data)
            data["retry"] = policy
            given = data.get("max_unexpected_retries", policy.retry_budget)
            if given != policy.retry_budget:
                raise ValueError(
                    f"max_unexpected_retries ({given}) differs from the retry policy's budget "
                    f"({policy.retry_budget}): set the budget in the policy"
                )
            data["max_unexpected_retries"] = policy.retry_budget
        elif (
            isinstance(data, Mapping)
            and "max_unexpected_retries" in data
            and data["max_unexpected_retries"] is None
        ):
            raise ValueError("max_unexpected_retries: None (unlimited) needs a retry policy (retry=...)")
        return data

    @property
    def retry_policy(self) -> AnyRetryPolicy:
        """The policy in force: ``retry``, or fixed ``retry_delay`` x ``max_unexpected_retries``."""
        if self.retry is not None:
            return self.retry
        return FixedRetry(delay=self.retry_delay, max_retries=self.max_unexpected_retries)

    @field_validator("specific_worker_ids")
    @classmethod
    def _check_worker_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for worker_id in () if _READING_STORED.get() else value:
            validate_worker_id(worker_id)
        return tuple(dict.fromkeys(value))

    @field_validator("specific_groups")
    @classmethod
    def _check_groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for group in () if _READING_STORED.get() else value:
            validate_group(group)
        return tuple(dict.fromkeys(value))

    @field_validator("ping_interval", "worker_timeout", "retry_delay")
    @classmethod
    def _check_duration(cls, value: timedelta) -> timedelta:
        if not _READING_STORED.get() and (value < timedelta(0) or value > timedelta(days=366)):
            raise ValueError("must be between 0 and 366 days")
        return value

    @field_validator("fair_key")
    @classmethod
    def _check_fair_key(cls, value: str | None) -> str | None:
        return validate_fair_key(value) if value is not None else None

    @field_validator("aging")
    @classmethod
    def _check_aging_step(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and not timedelta(milliseconds=1) <= value <= timedelta(days=1):
            raise ValueError("aging must be between 1 ms and 1 day")
        return timedelta(milliseconds=_ms(value)) if value is not None else None

    @model_validator(mode="after")
    def _check_aging(self) -> TaskOption:
        if self.aging is not None:
            if self.priority < 0:
                raise ValueError("aging needs a priority of at least 0 (a task ages from its priority up)")
            if self.aging * self.priority > MAX_AGING_SPAN:
                raise ValueError("priority x aging must be at most 366 days")
        return self

    @field_validator("run_timeout")
    @classmethod
    def _check_run_timeout(cls, value: timedelta | None) -> timedelta | None:
        if _READING_STORED.get():
            return value
        if value is not None and not timedelta(milliseconds=1) <= value <= timedelta(days=366):
            raise ValueError("run_timeout must be between 1 ms and 366 days")
        return value

    @field_validator("run_at", "deadline")
    @classmethod
    def _check_run_at(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must be timezone-aware (e.g. datetime.now(UTC))")
        return _utc_ms(value) if value is not None else None

    @model_validator(mode="after")
    def _check_lease(self) -> TaskOption:
        if _READING_STORED.get():
            return self
        if self.ping_interval <= timedelta(0):
            raise ValueError("ping_interval must be positive")
        if self.worker_timeout <= self.ping_interval:
            raise ValueError("worker_timeout must be longer than ping_interval")
        if (
            self.specific_worker_ids
            and not self.specific_groups
            and not self.same_worker_may_repeat
            and self.concurrent_worker_cnt > len(self.specific_worker_ids)
        ):
            # each worker runs a task once: fewer allowed workers than slots could never finish
            raise ValueError(
                f"concurrent_worker_cnt ({self.concurrent_worker_cnt}) is more than the "
                f"{len(self.specific_worker_ids)} specific_worker_ids allowed to run the task"
            )
        return self

    def to_storage(self, default_run_at: datetime) -> dict[str, Any]:
        """The option as stored (a fresh dict with fresh lists: documents never share them);
        ``run_at`` is ``default_run_at`` when not set."""
        held = _STORED_OPTIONS.get(id(self))
        if held is None or held[0] is not self:
            held = (self, self._storage_form())
            if len(_STORED_OPTIONS) >= _STORED_OPTIONS_MAX:
                _STORED_OPTIONS.clear()
            _STORED_OPTIONS[id(self)] = held
        form = held[1]
        return form | {
            "specific_worker_ids": list(self.specific_worker_ids),
            "specific_groups": list(self.specific_groups),
            "run_at": self.run_at if self.run_at is not None else default_run_at,
            "retry": self.retry.to_storage() if self.retry is not None else None,
            "lost_retry_delays_ms": list(form["lost_retry_delays_ms"]),
        }

    def _storage_form(self) -> dict[str, Any]:
        """``to_storage`` without ``run_at``: the same for every task sent with this option."""
        # the shorthand's table is its one delay (see lost_retry_delays_ms), without building a policy
        lost_delays = lost_retry_delays_ms(self.retry) if self.retry is not None else [_ms(self.retry_delay)]
        return {
            "priority": self.priority,
            "concurrent_worker_cnt": self.concurrent_worker_cnt,
            "specific_worker_ids": None,
            "specific_groups": None,
            "same_worker_may_repeat": self.same_worker_may_repeat,
            "ping_interval_ms": _ms(self.ping_interval),
            "worker_timeout_ms": _ms(self.worker_timeout),
            "max_unexpected_retries": self.max_unexpected_retries,
            "retry_delay_ms": _ms(self.retry_delay),
            "run_at": None,
            "retry": None,
            # the policy's delays (no jitter) for the bulk lease-expiry pass, which cannot run it
            "lost_retry_delays_ms": lost_delays,
            "deadline": self.deadline,
            "run_timeout_ms": _ms(self.run_timeout) if self.run_timeout is not None else None,
        } | self._flow_storage()

    def _flow_storage(self) -> dict[str, Any]:
        """The fairness key and the aging step, stored only when set: a task without them keeps
        the document it always had."""
        out: dict[str, Any] = {}
        if self.fair_key is not None:
            out["fair_key"] = self.fair_key
        if self.aging is not None:
            out["aging_ms"] = _ms(self.aging)
        return out

    @model_validator(mode="after")
    def _check_run_at_before_deadline(self) -> TaskOption:
        """A task to run at ``run_at`` that must start by ``deadline`` could never run if the
        one is after the other: refused when given (stored options are read as they are)."""
        if (
            not _READING_STORED.get()
            and self.run_at is not None
            and self.deadline is not None
            and self.run_at > self.deadline
        ):
            raise ValueError(
                f"run_at ({self.run_at.isoformat()}) is after deadline ({self.deadline.isoformat()}): "
                "the task could never start (it is not claimed before run_at and expires at deadline)"
            )
        return self

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> TaskOption:
        fields = dict(
            priority=doc["priority"],
            concurrent_worker_cnt=doc["concurrent_worker_cnt"],
            specific_worker_ids=tuple(doc["specific_worker_ids"]),
            specific_groups=tuple(doc.get("specific_groups") or ()),
            same_worker_may_repeat=doc.get("same_worker_may_repeat") is True,
            ping_interval=timedelta(milliseconds=doc["ping_interval_ms"]),
            worker_timeout=timedelta(milliseconds=doc["worker_timeout_ms"]),
            max_unexpected_retries=doc["max_unexpected_retries"],
            retry_delay=timedelta(milliseconds=doc["retry_delay_ms"]),
            run_at=doc.get("run_at"),
            retry=RetryPolicy.from_storage(doc["retry"]) if doc.get("retry") else None,
            deadline=doc.get("deadline"),
            run_timeout=timedelta(milliseconds=doc["run_timeout_ms"]) if doc.get("run_timeout_ms") else None,
            fair_key=doc.get("fair_key"),
            aging=timedelta(milliseconds=doc["aging_ms"]) if doc.get("aging_ms") else None,
        )
        # A stored option is read as it is: today's rules for new options (run_at before
        # deadline, say) are not applied to it, and one that breaks any other rule (written by an
        # earlier build, or by hand) is taken as stored, so that its task can still be listed,
        # shown, cancelled, restarted and removed.
        with reading_stored():
            try:
                return cls(**fields)
            except InvalidInput:
                return cls.model_construct(**fields)


class OptionChange(_UserInput):
    """A live change to a task's options. Fields left as None are unchanged."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priority: int | None = Field(None, ge=-1_000_000, le=1_000_000)
    specific_worker_ids: tuple[str, ...] | None = None
    specific_groups: tuple[str, ...] | None = None
    same_worker_may_repeat: bool | None = None
    ping_interval: timedelta | None = None
    worker_timeout: timedelta | None = None
    max_unexpected_retries: int | None = Field(None, ge=0, le=1_000_000)
    retry_delay: timedelta | None = None
    retry: AnyRetryPolicy | None = None
    run_at: datetime | None = None
    deadline: datetime | None = None
    run_timeout: timedelta | None = None
    # "" takes the fairness key away; timedelta(0) stops the aging
    fair_key: str | None = None
    aging: timedelta | None = None

    def apply(self, current: TaskOption) -> TaskOption:
        """Return the merged option, validated as a whole (raises ``InvalidInput``)."""
        merged = current.model_dump() | self.model_dump(exclude_none=True)
        if self.fair_key == "":
            merged["fair_key"] = None
        if self.aging == timedelta(0):
            merged["aging"] = None
        if self.retry is not None:
            merged["retry"] = self.retry
            merged.pop("max_unexpected_retries", None)  # the new policy's budget
            if self.max_unexpected_retries is not None:
                merged["max_unexpected_retries"] = self.max_unexpected_retries
        elif current.retry is not None:
            merged["retry"] = current.retry
            if self.max_unexpected_retries is not None or self.retry_delay is not None:
                merged.pop("retry")  # back to the fixed shorthand
                merged.setdefault("max_unexpected_retries", current.max_unexpected_retries)
        return TaskOption(**merged)


LOST_RETRY_TABLE = 32


def lost_retry_delays_ms(policy: RetryPolicy) -> list[int]:
    return list(_lost_retry_table(policy))


@functools.lru_cache(maxsize=256)
def _lost_retry_table(policy: RetryPolicy) -> tuple[int, ...]:
    """The policy's delays after failures 1..32 (the last repeats), for the lease-expiry pass: a
    bulk update that cannot run Python applies ``delays[min(fail_cnt, 31)]``. Jitter is left out;
    a ``per_day`` policy's jump to the next day is replaced by its delay (the consumer applies the
    day rule to failures it sees; a lost lease that lands on a new day retries within the day)."""
    table = policy.delay_table_ms(LOST_RETRY_TABLE)
    out: list[int] = []
    for delay in table:
        out.append(delay if delay is not None else (out[-1] if out else 0))
    # the last value repeats for every later failure, so a constant tail is stored once (a fixed
    # policy stores one number): every task document carries this table
    while len(out) > 1 and out[-1] == out[-2]:
        out.pop()
    return tuple(out)


# C0 and C1 control characters and DEL: never in an identifier (a key, a worker or plan id), which
# routes carry in their paths, logs print and terminals show
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def has_control(text: str) -> bool:
    """Does ``text`` hold a control character (new line, escape, NUL, ...)?"""
    return _CONTROL.search(text) is not None


def validate_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError("key must be a non-empty string")
    if len(key) > KEY_MAX_LEN:
        raise ValueError(f"key is longer than {KEY_MAX_LEN} characters")
    if has_control(key):
        raise ValueError("key must not contain control characters (new lines, tabs, escapes, NUL)")
    return key


GROUP_PREFIX = "g:"  # a group's claimer token is "<name>|g:<group>" (mscheduler.domain.state)


def validate_worker_id(worker_id: object) -> str:
    """1-200 characters, no control character, not starting with '$' nor with ``g:`` (a group's
    token)."""
    if (
        not isinstance(worker_id, str)
        or not worker_id
        or len(worker_id) > 200
        or worker_id.startswith(("$", GROUP_PREFIX))
        or has_control(worker_id)
    ):
        raise ValueError(
            "invalid worker id (1-200 characters, no control characters, not starting with '$' or 'g:')"
        )
    return worker_id


def validate_fair_key(value: object) -> str:
    """A fairness key: 1-200 letters, digits and ``_ . : @ + = -`` (no ``|`` or ``#``: it is
    part of a claimer token)."""
    if not isinstance(value, str) or not _FAIR_KEY_RE.fullmatch(value):
        raise ValueError(
            f"invalid fair_key {value!r}: 1-200 characters, letters, digits and '_', '.', ':', '@', "
            "'+', '=', '-'"
        )
    return value


def validate_group(group: object) -> str:
    """A group name: like a task name (letters, digits, '_', '.', ':', '-')."""
    if not isinstance(group, str) or not _NAME_RE.fullmatch(group):
        raise ValueError("invalid group: 1-200 characters, letters, digits, '_', '.', ':', '-'")
    return group


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):  # match() lets "job\n" through
        raise ValueError(
            "invalid task name: 1-200 characters, letters, digits, '_', '.', ':', '-', "
            "starting with a letter or '_'"
        )
    return name


def check_params(value: Any, depth: int = 0, *, path: str = "params") -> Any:
    """Accept JSON-like data that MongoDB stores as is; refuse operator-looking keys.

    Raises ``ValueError`` naming where the bad value is (``params['items'][2]``); ``path`` is the
    name of the whole value (``"result"`` for a handler's result).
    """
    if depth > PARAMS_MAX_DEPTH:
        raise ValueError(f"{path} nested deeper than {PARAMS_MAX_DEPTH} levels")
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"datetime at {path} must be timezone-aware (e.g. datetime.now(UTC))")
        try:
            return _utc_ms(value)
        except ValueError as exc:
            raise ValueError(f"datetime at {path} {exc}") from None
    if value is None or isinstance(value, (bool, int, str)):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            raise ValueError(f"integer at {path} must fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"NaN or infinity at {path} cannot be stored")
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"key {k!r} in {path} must be a string")
            if k.startswith("$") or "." in k or "\x00" in k:
                raise ValueError(f"key {k!r} in {path} must not start with '$' or contain '.' or NUL")
            out[k] = check_params(v, depth + 1, path=f"{path}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [check_params(v, depth + 1, path=f"{path}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"value of type {type(value).__name__} at {path} cannot be stored")


def _params_value(value: Any) -> Any:
    """Params as stored: a pydantic model is dumped to JSON-like data, then checked."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return check_params(value)


# The fields a task template shares with a plan's (mscheduler.domain.plans.Plan): one rule each.
TaskName = Annotated[str, AfterValidator(validate_name)]
Params = Annotated[Any, BeforeValidator(_params_value)]

MAX_CHILDREN = 100
CHILD_KEY_SEPARATOR = "/"
# a map step's fan-out: one item task per element of the list its source step returned
DEFAULT_MAX_ITEMS = 10_000
MAX_ITEMS_LIMIT = 100_000


def _positional(
    what: str, names: tuple[str, ...], args: tuple[Any, ...], data: dict[str, Any]
) -> dict[str, Any]:
    """A model's positional arguments as its fields, merged with the keyword ones."""
    if len(args) > len(names):
        raise TypeError(f"{what}() takes at most {len(names)} positional arguments ({len(args)} given)")
    for name, value in zip(names, args, strict=False):
        if name in data:
            raise TypeError(f"{what}() got multiple values for argument {name!r}")
        data[name] = value
    return data


def child_key(parent_key: str, name: str) -> str:
    """A derived key: a child task's ``<parent key>/<child name>`` (names hold no '/', so it is
    unique), and a map step's item ``<step key>/<index>`` (``item_key``). The scheduler makes
    every key of this shape itself."""
    return f"{parent_key}{CHILD_KEY_SEPARATOR}{name}"


def item_key(step_key: str, index: int) -> str:
    """The key of a map step's item ``index`` (0-based): derived from the step's key and the
    item's position, so a fan-out done twice (a crash mid-insert) never makes an item twice."""
    return child_key(step_key, str(index))


PLAN_KEY_PREFIX = "plan:"  # a plan's run tasks: ``plan:<plan id>:<fire time>`` (domain.plans)


def reserved_key(key: str) -> str | None:
    """Why ``key`` is one the scheduler makes itself, or None. A plan's run keys
    (``plan:<plan id>:<fire time>``) and child keys (``<parent key>/<child name>``) are
    predictable, so a sender that could create one first would take the run's or the child's
    place: no send creates them (a send of one is ``InvalidInput``), only the planner and a
    parent's own send do."""
    if key.startswith(PLAN_KEY_PREFIX):
        return f"keys starting with {PLAN_KEY_PREFIX!r} are made by plans for their runs"
    if CHILD_KEY_SEPARATOR in key:
        return (
            f"keys with {CHILD_KEY_SEPARATOR!r} are child tasks' (<parent key>/<child name>), made with "
            "their parent"
        )
    return None


class Child(_UserInput):
    """One named step of a task with children: ``name`` is the handler that runs it.

    ``params``: the child's own params (None: the parent's). ``option``: a ``TaskOption`` used as
    the child's, or an ``OptionChange`` applied to the parent's (None: the parent's option).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TaskName
    params: Params = None
    option: TaskOption | OptionChange | None = None
    # workflows (a graph of steps): the steps whose results this one needs; it starts once they
    # have all succeeded, and its handler reads their results (``TaskContext.results``)
    needs: tuple[TaskName, ...] = Field((), max_length=MAX_CHILDREN)
    # a map step: one item task per element of the list ``map_over`` returned, each with its
    # element as params (at most ``max_items``: a longer list fails the step); ``on_failure``:
    # "fail" (an item that ends without success fails the step, so the workflow) or "continue"
    # (the step succeeds once every item ended; the steps needing it get what succeeded)
    map_over: TaskName | None = None
    max_items: int = Field(DEFAULT_MAX_ITEMS, ge=1, le=MAX_ITEMS_LIMIT)
    on_failure: Literal["fail", "continue"] = "fail"

    if TYPE_CHECKING:

        def __init__(self, name: str, **data: Any) -> None: ...

    else:

        def __init__(self, *args: Any, **data: Any) -> None:
            # positional or by keyword; a missing name is the model's refusal (InvalidInput), also
            # when pydantic calls this __init__ to validate a child from JSON (an API body)
            super().__init__(**_positional(type(self).__name__, ("name",), args, data))

    @model_validator(mode="after")
    def _check_map(self) -> Child:
        if self.map_over is None and {"max_items", "on_failure"} & self.model_fields_set:
            raise ValueError("max_items and on_failure apply to a map step (map_over) only")
        if len(set(self.needs)) < len(self.needs):
            raise ValueError(f"needs: a step named twice in {list(self.needs)}")
        return self

    def option_for(self, parent: TaskOption) -> TaskOption:
        """The child's option, given the parent's."""
        if self.option is None:
            return parent
        if isinstance(self.option, OptionChange):
            return self.option.apply(parent)
        return self.option


def children_given(value: Any) -> Any:
    """Children as given (a task's, a plan's): names or ``Child`` objects, in a list."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError("children must be a list of names or Child objects")
    return tuple(Child(c) if isinstance(c, str) else c for c in value)


def check_graph(key: str, children: tuple[Child, ...]) -> None:
    """A workflow's steps form a DAG: every name a step needs or maps over is a step of it, none
    needs itself, there is no cycle, and a map step needs nothing but the step it maps over.
    Raises ``ValueError`` naming the step."""
    names = {c.name for c in children}
    for child in children:
        for need in (*child.needs, *((child.map_over,) if child.map_over else ())):
            if need not in names:
                raise ValueError(f"children: step {child.name!r} needs {need!r}, which is not a step")
            if need == child.name:
                raise ValueError(f"children: step {child.name!r} needs itself")
        if child.map_over is not None:
            if set(child.needs) - {child.map_over}:
                raise ValueError(
                    f"children: map step {child.name!r} needs only the step it maps over ({child.map_over!r})"
                )
            longest = item_key(child_key(key, child.name), child.max_items - 1)
            if len(longest) > KEY_MAX_LEN:
                raise ValueError(
                    f"children: the keys of {child.name!r}'s items would be longer than {KEY_MAX_LEN}"
                )
    order = graph_order({c.name: step_needs(c) for c in children})
    if order is None:
        raise ValueError("children: the steps' needs form a cycle")


def step_needs(child: Child) -> tuple[str, ...]:
    """What a step waits for: its needs, and the step it maps over."""
    if child.map_over is not None and child.map_over not in child.needs:
        return (*child.needs, child.map_over)
    return child.needs


def graph_order(needs: Mapping[str, Iterable[str]]) -> list[str] | None:
    """The steps in an order where each comes after what it needs (None: there is a cycle)."""
    remaining = {name: set(of) for name, of in needs.items()}
    order: list[str] = []
    ready = [name for name, of in remaining.items() if not of]
    while ready:
        name = ready.pop(0)
        order.append(name)
        for other, of in remaining.items():
            if name in of:
                of.discard(name)
                if not of:
                    ready.append(other)
    return order if len(order) == len(remaining) else None


class Task(_UserInput):
    """What a publisher sends: ``Task(key, name, params, option=TaskOption(...))``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    name: TaskName
    params: Params = None
    option: TaskOption = TaskOption()
    # named steps, each run by the handler of its name (mscheduler.services.children): in order, or at once
    children: tuple[Child, ...] | None = Field(None, min_length=1, max_length=MAX_CHILDREN)
    # sequential (each after the one before), parallel (all at once), or graph: each once the
    # steps it ``needs`` have succeeded (set by itself when a child has needs or maps)
    children_mode: Literal["sequential", "parallel", "graph"] | None = None
    # "params": not created while a live (pending or running) task has the same name and params
    # (the hash is mscheduler.domain.unique.params_hash), reported like an existing key
    unique_by: Literal["key", "params"] = "key"

    if TYPE_CHECKING:

        def __init__(self, key: str, name: str, params: Any = None, **data: Any) -> None: ...

    else:

        def __init__(self, *args: Any, **data: Any) -> None:
            # as Child: a missing key or name is InvalidInput naming the field, never a TypeError
            super().__init__(**_positional(type(self).__name__, ("key", "name", "params"), args, data))

    @field_validator("children", mode="before")
    @classmethod
    def _children(cls, value: Any) -> Any:
        return children_given(value)

    @model_validator(mode="after")
    def _check_children(self) -> Task:
        if self.children_mode is not None and not self.children:
            raise ValueError("children_mode needs children")
        names = [c.name for c in self.children or ()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"children: duplicate child names {twice}")
        for name in names:
            if len(child_key(self.key, name)) > KEY_MAX_LEN:
                raise ValueError(f"children: the key of child {name!r} would be longer than {KEY_MAX_LEN}")
        if self.children and any(c.needs or c.map_over for c in self.children):
            if self.children_mode not in (None, "graph"):
                raise ValueError(
                    f"children: needs and map_over make a graph, not a {self.children_mode} mode"
                )
            check_graph(self.key, self.children)
        return self

    @property
    def mode(self) -> str | None:
        """How its children run: the mode it was given, ``graph`` when a child needs or maps over
        another, else ``sequential`` (None: no children)."""
        if not self.children:
            return None
        if any(c.needs or c.map_over for c in self.children):
            return "graph"
        return self.children_mode or "sequential"

    @classmethod
    def _describe(cls, data: Mapping[str, Any]) -> str:
        key = data.get("key")
        if isinstance(key, str) and key and len(key) <= 100:
            return f"task {key!r}"
        return "task"

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        return validate_key(value)


class ErrorInfo(BaseModel):
    """Why an attempt failed."""

    type: str
    message: str
    traceback: str | None = None


class WorkerState(BaseModel):
    """One attempt by one worker."""

    worker_id: str
    attempt: str
    host: str | None = None
    pid: int | None = None
    status: AttemptStatus
    start_time: datetime
    ping_expire_time: datetime
    end_time: datetime | None = None
    retry_at: datetime | None = None
    result: Any = None
    error: ErrorInfo | None = None
    final: bool = False  # a failure that ended the task (the handler raised Fail)


class ChildInfo(BaseModel):
    """One child of a parent task, as the parent's summary has it (``TaskInfo.children``)."""

    name: str
    key: str
    status: TaskStatus


class StepInfo(BaseModel):
    """One step of a workflow as ``Operations.workflow`` shows it: its status, what it needs
    (in sequential mode the step before it), the step a map step maps over, and a fanned-out map
    step's items (how many, and how many are in each status)."""

    name: str
    key: str
    status: TaskStatus
    needs: list[str] = []
    map_over: str | None = None
    blocked: bool = False
    items: int | None = None
    item_statuses: dict[str, int] | None = None


class WorkflowInfo(BaseModel):
    """A task with children as a graph (``Operations.workflow``): its status and mode, its steps
    in order, and its final steps (those no step needs: ``wait`` returns their result)."""

    key: str
    status: TaskStatus
    mode: str
    steps: list[StepInfo]
    final: list[str]


class CheckpointInfo(BaseModel):
    """What a handler last saved with ``ctx.checkpoint``: the next attempt starts
    from ``data``. ``seq`` numbers the saves of that attempt."""

    data: Any = None
    time: datetime
    worker_id: str
    attempt: str
    seq: int


class ProgressInfo(BaseModel):
    """How far the last attempt said it was (``ctx.progress``)."""

    fraction: float
    message: str | None = None
    time: datetime
    worker_id: str
    attempt: str
    seq: int


class TaskInfo(BaseModel):
    """A task as stored, for reading (API, CLI, tests)."""

    key: str
    name: str
    params: Any
    option: TaskOption
    status: TaskStatus
    create_time: datetime
    update_time: datetime
    claim_at: datetime | None
    success_cnt: int
    fail_cnt: int
    running_cnt: int
    worker_states: list[WorkerState]
    # set when the task's document itself could not be written (too large): it failed for good
    broken: ErrorInfo | None = None
    # operator control: paused (not claimed until resumed), cancelled ({reason, time})
    paused: bool = False
    cancelled: dict[str, Any] | None = None
    # when it became terminal (retention counts from it; None while pending or running), and
    # its params hash when it was sent with unique_by="params"
    finish_time: datetime | None = None
    unique_hash: str | None = None
    # long tasks: the last checkpoint and progress a handler recorded (a restart clears both)
    checkpoint: CheckpointInfo | None = None
    progress: ProgressInfo | None = None
    # child tasks: a parent's children (in order) and mode; a child's parent key, whether it
    # waits for the child before it; a status an operator set by hand {status, reason, by, time}
    children: list[ChildInfo] | None = None
    children_mode: str | None = None
    parent: str | None = None
    blocked: bool = False
    marked: dict[str, Any] | None = None
    # a workflow's map step once fanned out (``children_mode`` "map"): how many items it has
    items: int | None = None

    @property
    def results(self) -> list[Any]:
        return [w.result for w in self.worker_states if w.status is AttemptStatus.SUCCEEDED]

    @property
    def attempts(self) -> int:
        """Attempts that ran and count (released, revoked and snoozed ones are not counted)."""
        uncounted = {
            AttemptStatus.RELEASED,
            AttemptStatus.REVOKED,
            AttemptStatus.SNOOZED,
            AttemptStatus.CANCELLED,
        }
        return sum(w.status not in uncounted for w in self.worker_states)

    @property
    def max_attempts(self) -> int | None:
        """Runs the retry policy allows a single-slot task (None: unlimited)."""
        return self.option.retry_policy.max_attempts

    @property
    def next_due(self) -> datetime | None:
        """When it may be claimed next (None: running, finished or out of budget)."""
        return self.claim_at

    @property
    def last_error(self) -> ErrorInfo | None:
        if self.broken is not None:
            return self.broken
        for w in reversed(self.worker_states):
            if w.error is not None:
                return w.error
        return None

    @field_validator("option", mode="wrap")
    @classmethod
    def _option_as_stored(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A task's option is read as stored wherever a TaskInfo is read (the API's answers, the
        client's reading of them): rules for new options do not make a task unreadable."""
        with reading_stored():
            return handler(value)

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> TaskInfo:
        with reading_stored():  # its option as stored (TaskOption.from_storage)
            return cls._from_storage(doc)

    @classmethod
    def _from_storage(cls, doc: Mapping[str, Any]) -> TaskInfo:
        state = doc["state"]
        definition: Mapping[str, Any] = doc.get("children") or {}
        is_map = definition.get("mode") == "map"
        return cls(
            key=doc["key"],
            name=doc["name"],
            params=doc.get("params"),
            option=TaskOption.from_storage(doc["option"]),
            status=state["status"],
            create_time=state["create_time"],
            update_time=state["update_time"],
            claim_at=state.get("claim_at"),
            success_cnt=state["success_cnt"],
            fail_cnt=state["fail_cnt"],
            running_cnt=state["running_cnt"],
            worker_states=[WorkerState.model_validate(w) for w in state["worker_states"]],
            broken=ErrorInfo.model_validate(state["broken"]) if state.get("broken") else None,
            paused=bool(state.get("paused")),
            cancelled=dict(state["cancelled"]) if state.get("cancelled") else None,
            finish_time=state.get("finish_time"),
            unique_hash=doc.get("unique_hash"),
            checkpoint=CheckpointInfo.model_validate(saved) if (saved := state.get("checkpoint")) else None,
            progress=ProgressInfo.model_validate(state["progress"]) if state.get("progress") else None,
            children=[ChildInfo.model_validate(c) for c in kids]
            if (kids := state.get("children")) and not is_map
            else None,
            children_mode=definition["mode"] if definition else None,
            items=int(definition.get("count", 0)) if is_map else None,
            parent=doc.get("parent"),
            blocked=state.get("blocked") is True,
            marked=dict(state["marked"]) if state.get("marked") else None,
        )


def checked_params_size(params: Any, max_bytes: int, what: str) -> None:
    """Refuse params larger than ``max_bytes`` (their BSON size) with ``InvalidInput`` naming
    ``what`` (``task 'k'``, ``plan 'p'``)."""
    size = encoded_size(params)
    if size > max_bytes:
        raise InvalidInput(
            f"{what}: params are {size} bytes, more than max_params_bytes ({max_bytes}); store "
            "large data elsewhere and send a reference"
        )


def encoded_size(value: Any) -> int:
    """Bytes ``value`` takes in a stored document (BSON), to enforce the params / result caps."""
    if value is None:  # most tasks have no params
        return _NONE_SIZE
    import bson

    return len(bson.encode({"v": value}))


_NONE_SIZE = 8  # len(bson.encode({"v": None})): a test holds it so
