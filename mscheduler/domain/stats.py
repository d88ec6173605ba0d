"""Task statistics: what each number means, and the one place they are put together.

The drivers compute raw aggregates (``MongoDriver`` with aggregation pipelines in
``drivers/mongo_stats.py``, ``MemoryDriver`` in Python in ``drivers/memory_stats.py``) into a
``RawStats``; ``assemble`` turns that into ``TaskStats``, so rates, ranks and ages are defined
once. Times count in milliseconds, the precision MongoDB stores.

Definitions:

* **counts**: tasks by name and status, the whole store (or the statuses asked for).
* **finished in the window**: tasks whose ``state.finish_time`` (when they became terminal) is in
  ``[now - window, now]`` and that ended ``succeeded`` or ``failed``. Cancelled and expired tasks
  ended without a handler's verdict and are not counted.
* **first-attempt success**: a finished task that succeeded and whose every attempt (entry of its
  current generation) succeeded: at least one, and none failed, lost, released, snoozed, ... For
  a fan-out task, "every attempt" means its ``concurrent_worker_cnt`` successes and nothing else.
  **second-attempt success**: succeeded with exactly one attempt that did not succeed. Both
  rates are shares of the tasks finished in the window (so ``first + second`` is the share that
  succeeded within two attempts); None when nothing finished.
* **durations**: ``end_time - start_time`` of the succeeded attempts of the tasks finished in the
  window; percentiles by nearest rank: the value at the 1-based rank ``ceil(p * n / 100)`` of
  the sorted durations (an observed value, identical on every driver).
* **throughput**: tasks that finished (succeeded or failed) per UTC minute over the last hour:
  ``THROUGHPUT_MINUTES`` buckets, the current minute (partial) last, whatever the window.
* **oldest pending**: among pending tasks that are due (``state.claim_at <= now``: not paused,
  not waiting for their ``run_at`` or a retry delay), ``now - claim_at`` of the one due longest
  ago: how long the longest-waiting task has been waiting for a worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import TaskStatus, validate_name

THROUGHPUT_MINUTES = 60
PERCENTILES = (50, 95)
DEFAULT_WINDOW = timedelta(hours=1)
WINDOW_MIN = timedelta(minutes=1)
# the window bounds the work: its finished tasks are read and its durations sorted
WINDOW_MAX = timedelta(days=7)
NAMES_MAX = 100
FINISHED_STATUSES = (TaskStatus.SUCCEEDED.value, TaskStatus.FAILED.value)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Told what a statistics read is about to do, before each read of the store (its argument says
# what, for people): a server-side aggregation reports nothing while it runs, so the phases are
# the progress a caller can show (``mscheduler stats``: a spinner naming the phase, with the time).
StatsStep = Callable[[str], None]
COUNT_STEP = "counting tasks by name and status"
WINDOW_STEP = "reading the tasks finished in the window"


def to_ms(value: datetime) -> int:
    """Milliseconds since the epoch, cut (not rounded) as BSON stores a date."""
    return (value - _EPOCH) // timedelta(milliseconds=1)


def rank_index(n: int, p: int) -> int:
    """0-based index of the ``p``-th percentile (nearest rank) among ``n`` sorted values."""
    return (p * n + 99) // 100 - 1


def hour_start(now: datetime) -> datetime:
    """Start of the first throughput bucket: the current UTC minute minus 59 minutes."""
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    return minute - timedelta(minutes=THROUGHPUT_MINUTES - 1)


def finished_range(now: datetime, window: timedelta) -> tuple[datetime, datetime]:
    """The ``state.finish_time`` range a driver reads: the window and the throughput hour."""
    return min(now - window, hour_start(now)), now


@dataclass(slots=True)
class RawStats:
    """What a driver computes; ``assemble`` derives the rest. Durations in milliseconds."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (name, status) -> tasks
    oldest_due: dict[str, datetime] = field(default_factory=dict)  # name -> earliest due claim_at
    # name -> [finished, succeeded, first-attempt successes, second-attempt successes]
    finished: dict[str, list[int]] = field(default_factory=dict)
    # name -> (succeeded attempts, {percentile: duration ms})
    durations: dict[str, tuple[int, dict[int, int]]] = field(default_factory=dict)
    throughput: dict[tuple[int, str], int] = field(default_factory=dict)  # (bucket, status) -> tasks


class ThroughputBucket(BaseModel):
    """Tasks that finished in one UTC minute."""

    model_config = ConfigDict(frozen=True)

    start: datetime
    succeeded: int
    failed: int


class NameStats(BaseModel):
    """Statistics of the tasks of one name (see the module's definitions)."""

    model_config = ConfigDict(frozen=True)

    name: str
    counts: dict[str, int]  # by status
    finished: int  # in the window, succeeded or failed
    succeeded: int
    failed: int
    first_attempt_successes: int
    second_attempt_successes: int
    first_attempt_success_rate: float | None
    second_attempt_success_rate: float | None
    succeeded_attempts: int  # durations measured
    duration_p50: float | None  # seconds
    duration_p95: float | None
    oldest_pending_age: float | None  # seconds


class TaskStats(BaseModel):
    """The store's statistics at ``now``; the per-name parts in ``names``, sorted by name.

    With ``window`` None only the counts and the oldest pending ages were computed (one
    aggregation): the window's numbers are 0 / None and ``throughput`` is empty."""

    model_config = ConfigDict(frozen=True)

    now: datetime
    window_seconds: float | None
    counts: dict[str, int]  # by status, every name
    total: int
    finished: int
    succeeded: int
    failed: int
    first_attempt_successes: int
    second_attempt_successes: int
    first_attempt_success_rate: float | None
    second_attempt_success_rate: float | None
    oldest_pending_age: float | None
    throughput: list[ThroughputBucket]
    names: list[NameStats]


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _percentile(durations: tuple[int, dict[int, int]] | None, p: int) -> float | None:
    if durations is None or durations[0] == 0:
        return None
    return durations[1][p] / 1000


def assemble(
    raw: RawStats, now: datetime, window: timedelta | None, statuses: tuple[str, ...] | None = None
) -> TaskStats:
    """``TaskStats`` from a driver's raw aggregates (``statuses``: the statuses counted)."""
    counted = statuses if statuses is not None else tuple(s.value for s in TaskStatus)
    now_ms = to_ms(now)
    names = sorted(
        {name for name, _ in raw.counts} | set(raw.oldest_due) | set(raw.finished) | set(raw.durations)
    )
    per_name: list[NameStats] = []
    for name in names:
        counts = {s: raw.counts.get((name, s), 0) for s in counted}
        finished, succeeded, first, second = raw.finished.get(name, [0, 0, 0, 0])
        due = raw.oldest_due.get(name)
        per_name.append(
            NameStats(
                name=name,
                counts=counts,
                finished=finished,
                succeeded=succeeded,
                failed=finished - succeeded,
                first_attempt_successes=first,
                second_attempt_successes=second,
                first_attempt_success_rate=_rate(first, finished),
                second_attempt_success_rate=_rate(second, finished),
                succeeded_attempts=raw.durations[name][0] if name in raw.durations else 0,
                duration_p50=_percentile(raw.durations.get(name), 50),
                duration_p95=_percentile(raw.durations.get(name), 95),
                oldest_pending_age=(now_ms - to_ms(due)) / 1000 if due is not None else None,
            )
        )
    totals = {s: sum(n.counts[s] for n in per_name) for s in counted}
    finished = sum(n.finished for n in per_name)
    succeeded = sum(n.succeeded for n in per_name)
    first = sum(n.first_attempt_successes for n in per_name)
    second = sum(n.second_attempt_successes for n in per_name)
    ages = [n.oldest_pending_age for n in per_name if n.oldest_pending_age is not None]
    throughput: list[ThroughputBucket] = []
    if window is not None:
        start = hour_start(now)
        throughput = [
            ThroughputBucket(
                start=start + timedelta(minutes=i),
                succeeded=raw.throughput.get((i, TaskStatus.SUCCEEDED.value), 0),
                failed=raw.throughput.get((i, TaskStatus.FAILED.value), 0),
            )
            for i in range(THROUGHPUT_MINUTES)
        ]
    return TaskStats(
        now=now,
        window_seconds=window.total_seconds() if window is not None else None,
        counts=totals,
        total=sum(totals.values()),
        finished=finished,
        succeeded=succeeded,
        failed=finished - succeeded,
        first_attempt_successes=first,
        second_attempt_successes=second,
        first_attempt_success_rate=_rate(first, finished),
        second_attempt_success_rate=_rate(second, finished),
        oldest_pending_age=max(ages) if ages else None,
        throughput=throughput,
        names=per_name,
    )


def attempt_class(entries: Sequence[Mapping[str, object]]) -> int | None:
    """1 for a first-attempt success, 2 for a second-attempt one, else None (of a succeeded
    task's entries)."""
    succeeded = sum(1 for e in entries if e["status"] == "succeeded")
    others = len(entries) - succeeded
    if succeeded == 0 or others > 1:
        return None
    return others + 1


def checked_input(
    window: timedelta | float | None, names: Iterable[str] | None, statuses: Iterable[str] | None
) -> tuple[timedelta | None, tuple[str, ...] | None, tuple[str, ...] | None]:
    """Validated ``Operations.stats`` arguments (``InvalidInput`` names the field): a window
    (a timedelta or seconds) from ``WINDOW_MIN`` to ``WINDOW_MAX`` or None, task names, statuses."""
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, (timedelta, int, float)):
            raise InvalidInput("window: a timedelta or a number of seconds")
        if not isinstance(window, timedelta):
            if not math.isfinite(window) or not 0 < window <= WINDOW_MAX.total_seconds():
                raise InvalidInput(f"window: from {WINDOW_MIN} to {WINDOW_MAX}")
            window = timedelta(seconds=window)
        if not WINDOW_MIN <= window <= WINDOW_MAX:
            raise InvalidInput(f"window: from {WINDOW_MIN} to {WINDOW_MAX}")
    checked_names = None
    if names is not None:
        if isinstance(names, str):
            raise InvalidInput("names: a list of task names, not one string")
        try:
            checked_names = tuple(validate_name(n) for n in names)
        except ValueError as exc:
            raise InvalidInput(f"names: {exc}") from exc
        if not 1 <= len(checked_names) <= NAMES_MAX:
            raise InvalidInput(f"names: from 1 to {NAMES_MAX} names")
    checked_statuses = None
    if statuses is not None:
        if isinstance(statuses, str):
            raise InvalidInput("statuses: a list of statuses, not one string")
        try:
            checked_statuses = tuple(dict.fromkeys(TaskStatus(s).value for s in statuses))
        except ValueError:
            choices = ", ".join(s.value for s in TaskStatus)
            raise InvalidInput(f"statuses: unknown status (one of {choices})") from None
        if not checked_statuses:
            raise InvalidInput("statuses: at least one")
    return window, checked_names, checked_statuses
