"""Task listings: the filters an operator may use and the opaque cursor of cursor paging.

Every filter is a typed value from an allow-list (a status from ``TaskStatus``, a task name, a
key prefix, a worker id, a worker group, a creation or finish time range); anything else — a
dict, a list, a string carrying ``$`` — is refused with ``InvalidInput`` before the store is
asked. ``Operations.page_tasks`` is the
one user; the CLI and the REST API pass their input through it unchanged.

A cursor is the sort key of a page's last task, base64url-encoded JSON, and the order it was
made in (``ListParams.order``: creation, finish time or key): the next page starts strictly
after it, through the index, so page 1,000 costs what page 1 does (no skip). Keys created (or
tasks finished) meanwhile after the cursor appear on later pages; none is returned twice.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import (
    GROUP_PREFIX,
    KEY_MAX_LEN,
    TaskInfo,
    TaskStatus,
    has_control,
    validate_group,
    validate_name,
)

LIST_LIMIT_MAX = 1000
# The listing orders (``ListParams.order``); a cursor names the order it was made in.
BY_CREATED, BY_KEY, BY_FINISHED = "created", "key", "finished"
BY_UPDATED, BY_STATUS, BY_NAME, BY_ATTEMPTS = "updated", "status", "name", "attempts"
CURSOR_MAX_LEN = 4096
CURSOR_VERSION = 1
ORDERS = (BY_CREATED, BY_KEY, BY_FINISHED, BY_UPDATED, BY_STATUS, BY_NAME, BY_ATTEMPTS)
WORKER_ID_MAX_LEN = 512


@dataclass(slots=True, frozen=True)
class Order:
    """What an order sorts by, as stored fields: ``rank`` (fields before the time; status, name
    or the attempt count), then ``time`` (None: key order), then ``key``. Every order ends with
    the key, so it is total and a cursor names one position."""

    rank: tuple[str, ...]
    time: str | None


ORDER_FIELDS = {
    BY_CREATED: Order((), "state.create_time"),
    BY_UPDATED: Order((), "state.update_time"),
    BY_FINISHED: Order((), "state.finish_time"),
    BY_STATUS: Order(("state.status",), "state.create_time"),
    BY_NAME: Order(("name", "state.status"), "state.create_time"),
    BY_ATTEMPTS: Order(("state.attempt_cnt",), "state.create_time"),
    BY_KEY: Order((), None),
}


@dataclass(slots=True, frozen=True)
class ListParams:
    """A page of tasks (validated by ``list_params`` below). Order (``order``): ``key`` alone
    with ``key_prefix`` (the prefix is a range of the key index); else ``(state.finish_time,
    key)`` with a finished range; else ``(state.create_time, key)``. Filters combine with "and".
    ``worker_id``: tasks with an entry of that worker (current generation); ``group``: tasks
    aimed at that worker group (in ``option.specific_groups``). ``created_from`` /
    ``finished_from`` are inclusive, ``created_to`` / ``finished_to`` exclusive; a task without
    a ``finish_time`` (pending, running, or restarted) is in no finished range. ``after_key``
    (with ``after_time``, the order's time, in the time orders) is the sort key of the previous
    page's last task: the page starts strictly after it (cursor paging: a deep page costs what
    the first does)."""

    status: str | None = None
    name: str | None = None
    limit: int = 100
    key_prefix: str | None = None
    worker_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    after_time: datetime | None = None
    after_key: str | None = None
    finished_from: datetime | None = None
    finished_to: datetime | None = None
    group: str | None = None
    # an order asked for (``sort``; None: the one the filters make), its direction, and the
    # cursor's leading sort values in the orders that rank before the time (status, name,
    # attempts). ``backwards``: the page before a cursor, read in the other direction (the
    # drivers see only that direction; ``task_page`` puts the page back in order).
    sort: str | None = None
    descending: bool = False
    after_rank: tuple[Any, ...] | None = None
    backwards: bool = False

    @property
    def order(self) -> str:
        """The order: ``sort`` if asked for; else what the filters make it (``BY_KEY`` with a key
        prefix, ``BY_FINISHED`` with a finished range, else ``BY_CREATED``)."""
        if self.sort is not None:
            return self.sort
        if self.key_prefix is not None:
            return BY_KEY
        if self.finished_from is not None or self.finished_to is not None:
            return BY_FINISHED
        return BY_CREATED

    @property
    def fields(self) -> Order:
        return ORDER_FIELDS[self.order]

    @property
    def after(self) -> tuple[Any, ...] | None:
        """The cursor's position: the order's sort values of the task it was made after."""
        if self.after_key is None:
            return None
        if self.order == BY_KEY:
            return (self.after_key,)
        return (*(self.after_rank or ()), self.after_time, self.after_key)


@dataclass(slots=True, frozen=True)
class TaskPage:
    """One page of a listing; ``next_cursor`` continues it (None: this was the last page),
    ``prev_cursor`` goes back to the page before (None: this is the first)."""

    tasks: list[TaskInfo]
    next_cursor: str | None
    prev_cursor: str | None = None


class TaskFilters(TypedDict, total=False):
    """The keyword arguments of a listing (``Operations.page_tasks`` / ``list_tasks``), each
    checked by ``list_params``: ranges are ``[from, to)``, aware datetimes."""

    status: str | None
    name: str | None
    key_prefix: str | None
    worker_id: str | None
    created_from: datetime | None
    created_to: datetime | None
    finished_from: datetime | None
    finished_to: datetime | None
    group: str | None
    cursor: str | None
    limit: int
    sort: str | None


def list_params(
    *,
    status: object = None,
    name: object = None,
    key_prefix: object = None,
    worker_id: object = None,
    created_from: object = None,
    created_to: object = None,
    finished_from: object = None,
    finished_to: object = None,
    group: object = None,
    cursor: object = None,
    limit: object = 100,
    sort: object = None,
) -> ListParams:
    """The driver's params for a listing, every value checked (``InvalidInput`` naming the field).

    ``limit`` is what the caller asked for; the params ask for one more, so the caller can tell
    whether a next page exists. ``sort``: one of ``ORDERS``, ``-`` in front for descending
    (``-created``: newest first); a key prefix lists in key order only (``key`` / ``-key``: its
    range of the key index is what bounds the listing)."""
    order, descending = _sort(sort)
    if order is not None and order != BY_KEY and key_prefix is not None:
        raise InvalidInput(
            f"sort: {sort!s} cannot go with key_prefix (a key prefix lists in key order: sort=key or -key)"
        )
    if status is not None:
        if not isinstance(status, str) or status not in {s.value for s in TaskStatus}:
            choices = ", ".join(s.value for s in TaskStatus)
            raise InvalidInput(f"status: unknown status (one of {choices})")
        status = TaskStatus(status).value
    if name is not None:
        try:
            name = validate_name(name)
        except ValueError as exc:
            raise InvalidInput(f"name: {exc}") from None
    if group is not None:
        try:
            group = validate_group(group)  # what TaskOption.specific_groups accepts
        except ValueError as exc:
            raise InvalidInput(f"group: {exc}") from None
    key_prefix = _plain_string(key_prefix, "key_prefix", KEY_MAX_LEN)
    worker_id = _plain_string(worker_id, "worker_id", WORKER_ID_MAX_LEN)
    if worker_id is not None and worker_id.startswith(GROUP_PREFIX):
        raise InvalidInput(f"worker_id: must not start with {GROUP_PREFIX!r} (a group's token)")
    created_from, created_to = _range(created_from, created_to, "created")
    finished_from, finished_to = _range(finished_from, finished_to, "finished")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= LIST_LIMIT_MAX:
        raise InvalidInput(f"limit: must be an integer from 1 to {LIST_LIMIT_MAX}")
    params = ListParams(
        status=status,
        name=name,
        limit=limit + 1,
        key_prefix=key_prefix,
        worker_id=worker_id,
        created_from=created_from,
        created_to=created_to,
        finished_from=finished_from,
        finished_to=finished_to,
        group=group,
        sort=order,
        descending=descending,
    )
    if cursor is None:
        return params
    position = decode_position(cursor, params.order, descending)
    return replace(
        params,
        after_rank=position.rank or None,
        after_time=position.time,
        after_key=position.key,
        backwards=position.before,
        descending=descending != position.before,  # back: read the other way from the cursor
    )


def _sort(sort: object) -> tuple[str | None, bool]:
    """``(order, descending)`` of a ``sort`` value (``created``, ``-updated``, ...)."""
    if sort is None:
        return None, False
    if not isinstance(sort, str) or sort.lstrip("-") not in ORDERS or sort.startswith("--"):
        choices = ", ".join(ORDERS)
        raise InvalidInput(f"sort: one of {choices}, with '-' in front for descending")
    return sort.lstrip("-"), sort.startswith("-")


def task_page(params: ListParams, docs: Sequence[dict[str, Any]]) -> TaskPage:
    """The page from what the driver returned for ``params`` (one more than asked for): its
    tasks in the listing's order, a cursor after the last one when more follow and a cursor
    before the first one when the page did not start at the beginning."""
    limit = params.limit - 1
    tasks = [TaskInfo.from_storage(doc) for doc in docs[:limit]]
    more = len(docs) > limit and bool(tasks)
    order = params.order
    if params.backwards:  # read from the cursor towards the start: put the page back in order
        tasks.reverse()
        descending = not params.descending
        before = encode_cursor(order, tasks[0], descending=descending, before=True) if more else None
        after = encode_cursor(order, tasks[-1], descending=descending) if tasks else None
        return TaskPage(tasks, after, before)
    after = encode_cursor(order, tasks[-1], descending=params.descending) if more else None
    started = params.after_key is not None and bool(tasks)
    before = encode_cursor(order, tasks[0], descending=params.descending, before=True) if started else None
    return TaskPage(tasks, after, before)


# -- the cursor -----------------------------------------------------------------------------------


def sort_values(order: str, info: TaskInfo) -> tuple[tuple[Any, ...], datetime | None]:
    """``(rank, time)`` of a task in ``order`` (its key comes last in every order)."""
    times = {
        BY_CREATED: info.create_time,
        BY_UPDATED: info.update_time,
        BY_FINISHED: info.finish_time,
        BY_KEY: None,
    }
    ranks: dict[str, tuple[Any, ...]] = {
        BY_STATUS: (info.status.value,),
        BY_NAME: (info.name, info.status.value),
        BY_ATTEMPTS: (info.attempts,),
    }
    return ranks.get(order, ()), times.get(order, info.create_time)


def encode_cursor(order: str, last: TaskInfo, *, descending: bool = False, before: bool = False) -> str:
    """The cursor after ``last`` in ``order`` (``before``: the cursor before it, to page back)."""
    body: dict[str, Any] = {"v": CURSOR_VERSION, "o": order, "k": last.key}
    rank, when = sort_values(order, last)
    if order != BY_KEY:
        if when is None:  # the finished range selected it: it has a finish time
            raise ValueError(f"task {last.key!r} has no finish time: not from a finished listing")
        body["t"] = when.astimezone(UTC).isoformat()
    if rank:
        body["r"] = list(rank)
    if descending:
        body["d"] = 1
    if before:
        body["b"] = 1
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@dataclass(slots=True, frozen=True)
class Position:
    """Where a cursor points: the sort values of a task, and whether the page goes on after it
    or comes back before it (``before``)."""

    rank: tuple[Any, ...]
    time: datetime | None
    key: str
    before: bool = False


def decode_cursor(cursor: object, order: str) -> tuple[datetime | None, str]:
    """``(after_time, after_key)`` from a cursor made for an ascending listing in ``order``."""
    position = decode_position(cursor, order, False)
    return position.time, position.key


def decode_position(cursor: object, order: str, descending: bool) -> Position:
    """The position of a cursor made for a listing in ``order`` and direction."""
    bad = InvalidInput("cursor: not a cursor of this listing (pass next_cursor back unchanged)")
    if not isinstance(cursor, str) or not cursor or len(cursor) > CURSOR_MAX_LEN:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        body = json.loads(raw.decode())
    except (binascii.Error, ValueError):  # UnicodeDecodeError, JSONDecodeError: ValueErrors
        raise bad from None
    if not isinstance(body, dict) or body.get("v") != CURSOR_VERSION or body.get("o") not in ORDERS:
        raise bad
    if body["o"] != order or bool(body.get("d")) != descending:
        raise InvalidInput(
            "cursor: made for a listing in another order (a key_prefix lists in key order, a "
            "finished range in finish-time order, other listings in creation order, or as sort "
            "says): keep the same filters and sort from page to page"
        )
    key = body.get("k")
    if not isinstance(key, str) or not key or len(key) > KEY_MAX_LEN:
        raise bad
    before = body.get("b") == 1
    if order == BY_KEY:
        return Position((), None, key, before)
    try:
        after_time = datetime.fromisoformat(body["t"]) if isinstance(body.get("t"), str) else None
    except ValueError:
        after_time = None
    if after_time is None or after_time.tzinfo is None:
        raise bad
    try:
        at = after_time.astimezone(UTC)
    except OverflowError:  # a forged time at the edge of the representable range
        raise bad from None
    return Position(_rank(body.get("r"), order, bad), at, key, before)


def _rank(value: object, order: str, bad: InvalidInput) -> tuple[Any, ...]:
    """A cursor's leading sort values, checked against what the order ranks by."""
    expected = ORDER_FIELDS[order].rank
    if not expected:
        if value is not None:
            raise bad
        return ()
    if not isinstance(value, list) or len(value) != len(expected):
        raise bad
    for field, item in zip(expected, value, strict=True):
        if field == "state.attempt_cnt":
            ok = isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 2**31
        elif field == "state.status":
            ok = item in {s.value for s in TaskStatus}
        else:
            ok = isinstance(item, str) and _is_name(item)
        if not ok:
            raise bad
    return tuple(value)


def _is_name(value: str) -> bool:
    try:
        validate_name(value)
    except ValueError:
        return False
    return True


def prefix_end(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (None: there is none). The
    server compares strings by UTF-8 bytes, which is code point order; surrogates cannot be
    stored, so the successor of U+D7FF is U+E000."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code == 0xD800:
            code = 0xE000
        if code <= 0x10FFFF:
            return "".join(chars) + chr(code)
    return None


# -- values ---------------------------------------------------------------------------------------


def _plain_string(value: object, field: str, max_len: int) -> str | None:
    """A string filter: compared as a value, never read as an operator; ``$`` is refused all the
    same, so an injection attempt fails loudly instead of matching nothing."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{field}: must be a non-empty string (got a {type(value).__name__})")
    if len(value) > max_len:
        raise InvalidInput(f"{field}: longer than {max_len} characters")
    if "$" in value or "\x00" in value:
        raise InvalidInput(f"{field}: must not contain '$' or NUL (filters are values, not operators)")
    if has_control(value):
        raise InvalidInput(f"{field}: must not contain control characters (no key or id holds one)")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidInput(f"{field}: not valid Unicode text (a lone surrogate)") from None
    return value


def _range(start: object, end: object, what: str) -> tuple[datetime | None, datetime | None]:
    """``{what}_from`` (inclusive) and ``{what}_to`` (exclusive), each checked, ``to`` after ``from``."""
    lower, upper = _instant(start, f"{what}_from"), _instant(end, f"{what}_to")
    if lower is not None and upper is not None and upper <= lower:
        raise InvalidInput(f"{what}_to: must be later than {what}_from (the range is [from, to))")
    return lower, upper


def _instant(value: object, field: str) -> datetime | None:
    """A timezone-aware datetime, in UTC, rounded up to the millisecond: stored times have
    millisecond precision, so ``>= x`` and ``< x`` select the same tasks on every driver."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(f"{field}: must be a timezone-aware datetime (got a {type(value).__name__})")
    try:
        value = value.astimezone(UTC)
        extra = value.microsecond % 1000
        return value if not extra else value + timedelta(microseconds=1000 - extra)
    except OverflowError:  # a time at the edge of the representable range
        raise InvalidInput(f"{field}: out of range") from None
