"""Publishing tasks: ``send`` / ``send_many`` (idempotent by key), ``wait``, live option changes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from mscheduler.domain.clock import Clock, SystemClock, check_same_time, sleep_unless
from mscheduler.domain.exceptions import (
    InvalidInput,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    UnknownTask,
)
from mscheduler.domain.family import GRAPH, MAP, final_steps
from mscheduler.domain.listing import ListParams
from mscheduler.domain.model import (
    OptionChange,
    Task,
    TaskInfo,
    TaskOption,
    TaskStatus,
    validate_key,
)
from mscheduler.domain.state import CHILD_ENDED_BADLY
from mscheduler.drivers.base import Driver
from mscheduler.observability.tracing import tracer_for
from mscheduler.operations import change_option, live_handlers, warn_if_unhandled
from mscheduler.publishing import (
    DEFAULT_MAX_PARAMS_BYTES,
    checked_by,
    checked_max_params_bytes,
    child_names,
    insert_families,
    prepared_families,
)

log = logging.getLogger("mscheduler.publisher")


class Publisher:
    """Sends tasks and reads their outcome.

    :param driver: the storage (``MongoDriver`` or ``MemoryDriver``).
    :param clock: time source; tests pass a ``FakeClock``.
    :param max_params_bytes: the largest params a task may carry (their BSON size); larger ones
        are refused by ``send`` with ``InvalidInput``, nothing written. A task's document also
        holds its attempts, and MongoDB's limit is 16 MiB per document.
    :param tracing: OpenTelemetry spans around sends, with the trace context stored on each task
        (``mscheduler.observability.tracing``); None follows its ``enable()`` (off by default).
    """

    def __init__(
        self,
        driver: Driver,
        *,
        clock: Clock | None = None,
        max_params_bytes: int = DEFAULT_MAX_PARAMS_BYTES,
        tracing: bool | None = None,
    ) -> None:
        checked_max_params_bytes(max_params_bytes)
        check_same_time(driver, clock, "this Publisher")
        self._tracer = tracer_for(tracing)
        self.driver = driver
        self.clock: Clock = clock or SystemClock()
        self.max_params_bytes = max_params_bytes
        self._set_up = False
        self._names_checked: set[str] = set()
        self._listeners: list[Callable[[str, dict[str, Any]], None]] = []

    def add_listener(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """Call ``listener("sent", {"key", "name", "created"})`` for each task ``send`` or
        ``send_many`` stored or found existing (``created`` False), synchronously (metrics)."""
        self._listeners.append(listener)

    def _emit_sent(self, tasks: list[Task], created: list[bool]) -> None:
        for listener in self._listeners:
            for task, new in zip(tasks, created, strict=True):
                listener("sent", {"key": task.key, "name": task.name, "created": new})

    async def _setup(self) -> None:
        """Check the store before the first insert: uniqueness by key needs the unique index, and
        a publisher may write to a store no consumer has used yet. The indexes are
        built by ``mscheduler setup`` (on mongomock, here)."""
        if not self._set_up:
            await self.driver.prepare()
            self._set_up = True

    def _trace(self) -> dict[str, str] | None:
        return self._tracer.carrier() if self._tracer is not None else None

    async def _live_handlers(self) -> set[str]:
        """Task names that a live registered consumer handles."""
        return await live_handlers(self.driver, self.clock.now())

    async def _warn_if_unhandled(self, names: Iterable[str]) -> None:
        """Warn once per name when no live consumer handles it: such a task waits silently (the
        one rule ``Operations.add_plan`` follows too)."""
        new = set(names) - self._names_checked
        if not new:
            return
        self._names_checked |= new
        await warn_if_unhandled(self.driver, new, self.clock.now(), log)

    async def send(
        self, task: Task, *, reset_finished: bool = False, session: Any = None, by: str | None = None
    ) -> bool:
        """Publish ``task`` unless its key exists; True if this call created (or reset) it.

        A task that exists is left alone, running or not; with ``reset_finished=True`` a task that
        ended (succeeded or failed) is reset to pending with the new params and options (its
        attempts kept in its history as an earlier generation). A task sent with
        ``unique_by="params"`` is not created (False) while a pending or running task has the same
        name and params, nor reset then. Pass a PyMongo ``session`` to insert inside
        your own transaction. ``by``: who sends, in the ``sent`` event and a reset's
        history. Keys the scheduler makes itself (``plan:...``, ``<parent>/<child>``) are refused.
        """
        by = checked_by(by)
        if self._tracer is not None and isinstance(task, Task):
            with self._tracer.sending([task.key], [task.name]):
                return await self._send(task, reset_finished, session, by)
        return await self._send(task, reset_finished, session, by)

    async def _send(self, task: Task, reset_finished: bool, session: Any, by: str | None) -> bool:
        if not isinstance(task, Task):
            raise InvalidInput(f"send() takes a Task, got {type(task).__name__}")
        families = prepared_families(
            [task],
            now=self.clock.now(),
            reset_finished=reset_finished,
            max_params_bytes=self.max_params_bytes,
            trace=self._trace(),
        )
        await self._setup()
        created = (
            await insert_families(
                self.driver, families, self.clock.now, reset_finished=reset_finished, session=session, by=by
            )
        )[0]
        self._emit_sent([task], [created])
        await self._warn_if_unhandled(child_names(task))
        return created

    async def send_many(
        self,
        tasks: Iterable[Task],
        *,
        reset_finished: bool = False,
        session: Any = None,
        by: str | None = None,
    ) -> list[bool]:
        """Publish many tasks, one round trip per ``SEND_MANY_BATCH``; a bool per task, in order."""
        tasks = list(tasks)
        by = checked_by(by)
        if self._tracer is not None:
            keys = [t.key for t in tasks if isinstance(t, Task)]
            with self._tracer.sending(keys, [t.name for t in tasks if isinstance(t, Task)]):
                return await self._send_many(tasks, reset_finished, session, by)
        return await self._send_many(tasks, reset_finished, session, by)

    async def _send_many(
        self, tasks: list[Task], reset_finished: bool, session: Any, by: str | None
    ) -> list[bool]:
        families = prepared_families(
            tasks,
            now=self.clock.now(),
            reset_finished=reset_finished,
            max_params_bytes=self.max_params_bytes,
            trace=self._trace(),
        )
        await self._setup()
        created = await insert_families(
            self.driver, families, self.clock.now, reset_finished=reset_finished, session=session, by=by
        )
        self._emit_sent(tasks, created)
        await self._warn_if_unhandled({n for t in tasks for n in child_names(t)})
        return created

    async def get(self, key: str) -> TaskInfo:
        """The task as stored; raises ``UnknownTask``."""
        doc = await self.driver.get_task(_key(key))
        if doc is None:
            raise UnknownTask(key)
        return TaskInfo.from_storage(doc)

    async def wait(
        self,
        key: str,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.05,
        max_poll_interval: float = 1.0,
    ) -> Any:
        """Wait until the task ends; return its result or raise ``TaskFailed``,
        ``TaskExpired`` or ``TaskCancelled``.

        With ``concurrent_worker_cnt`` > 1 the result is the list of every worker's result. A
        task with children returns ``{child name: its result}``, a workflow (``graph`` mode) its
        final step's result (``{name: result}`` of each when several steps are final), or raises
        ``TaskFailed`` with the error of the child that failed.
        Raises ``TimeoutError`` after ``timeout`` seconds (None waits for ever), on the
        publisher's clock. It reads the task again after each poll interval, and at once when
        an in-process store (``MemoryDriver``) says the task changed: so it also returns under a
        ``FakeClock`` nobody moves, as soon as the task has ended.
        """
        watch = _TaskWatch(self.driver, key)
        try:
            return await self._wait(key, timeout, poll_interval, max_poll_interval, watch)
        finally:
            watch.close()

    async def _wait(
        self,
        key: str,
        timeout: float | None,
        poll_interval: float,
        max_poll_interval: float,
        watch: _TaskWatch,
    ) -> Any:
        started = self.clock.monotonic()
        interval = poll_interval
        while True:
            watch.changed.clear()  # before the read: a change after it wakes the sleep below
            info = await self.get(key)
            if info.children is not None and info.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
                return await self._family_outcome(info)
            if info.status is TaskStatus.SUCCEEDED:
                return _result(info)
            if info.status is TaskStatus.EXPIRED:
                raise TaskExpired(key)
            if info.status is TaskStatus.CANCELLED:
                raise TaskCancelled(key, str((info.cancelled or {}).get("reason") or ""))
            if info.status is TaskStatus.FAILED:
                error = info.last_error
                raise TaskFailed(key, error.model_dump() if error else None)
            waited = self.clock.monotonic() - started
            if timeout is not None and waited >= timeout:
                hint = ""
                if info.status is TaskStatus.PENDING and info.name not in await self._live_handlers():
                    hint = f"; no live worker handles tasks named {info.name!r}"
                raise TimeoutError(f"task {key!r} is still {info.status.value} after {timeout}s{hint}")
            sleep = interval if timeout is None else min(interval, timeout - waited)
            await sleep_unless(self.clock, sleep, watch.changed)
            interval = min(interval * 1.5, max_poll_interval)

    async def _family_outcome(self, info: TaskInfo) -> Any:
        """A finished parent's result (its children's, by name; a workflow's: its final step's)
        or its failure (the first child that ended without success, with that child's error; a
        map step's: the error of an item that failed)."""
        if info.children_mode == GRAPH and info.status is TaskStatus.SUCCEEDED:
            doc = await self.driver.get_task(info.key)
            finals = final_steps(doc["children"]) if doc is not None else []
            read = await self.driver.read_results([key for _, key in finals])
            results = {name: read[key].result if key in read else None for name, key in finals}
            return next(iter(results.values())) if len(results) == 1 else results
        children = [await self.get(child.key) for child in info.children or ()]
        if info.status is TaskStatus.SUCCEEDED:
            return {c.name: _result(c) for c in children}
        bad = next((c for c in children if c.status.value in CHILD_ENDED_BADLY), None)
        if bad is None:  # the summary said failed, the children say otherwise now: a restart
            raise TaskFailed(info.key, None)
        culprit = await self._failed_item(bad) if bad.children_mode == MAP else bad
        error = (
            culprit.last_error.model_dump()
            if culprit.last_error
            else {"type": culprit.status.value, "message": (culprit.marked or {}).get("reason", "")}
        )
        where = bad.key if culprit is bad else f"{bad.key}, item {culprit.key}"
        error["message"] = f"child {bad.name!r} ({where}) {bad.status.value}: {error['message']}"
        raise TaskFailed(info.key, error)

    async def _failed_item(self, step: TaskInfo) -> TaskInfo:
        """An item of a failed map step that ended without success (the step itself if none)."""
        for status in CHILD_ENDED_BADLY:
            page = await self.driver.list_tasks(ListParams(status=status, key_prefix=f"{step.key}/", limit=1))
            if page:
                return TaskInfo.from_storage(page[0])
        return step

    async def update_option(self, key: str, change: OptionChange) -> TaskOption:
        """Change a task's options while it may be running; returns the new options.

        Removing a running worker from ``specific_worker_ids`` stops it at its next ping; a new
        ``ping_interval`` applies from the next ping; the rest applies to the next claim.
        """
        return await change_option(self.driver, key, change, self.clock.now())


class _TaskWatch:
    """Wakes ``Publisher.wait`` when its task (or a child) changes, where the store says so for
    free: an in-process store (``driver.in_process``: ``follow_task``). Elsewhere ``wait`` polls."""

    def __init__(self, driver: Driver, key: str) -> None:
        self._stop: Callable[[], None] | None = None
        follow = getattr(driver, "follow_task", None) if getattr(driver, "in_process", False) else None
        if follow is not None:
            self.changed, self._stop = follow(key)
        else:
            self.changed = asyncio.Event()  # never set: wait polls

    def close(self) -> None:
        if self._stop is not None:
            self._stop()


def _result(info: TaskInfo) -> Any:
    """A succeeded task's result: every worker's with ``concurrent_worker_cnt`` > 1, else the one
    (None for a task set succeeded by hand)."""
    if info.option.concurrent_worker_cnt > 1:
        return info.results
    return info.results[0] if info.results else None


def _key(key: str) -> str:
    try:
        return validate_key(key)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
