"""Publishing tasks: ``send`` / ``send_many`` (idempotent by key), ``wait``, live option changes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from mscheduler.clock import Clock, SystemClock
from mscheduler.drivers.base import Driver, InsertParams, NewTask, UpdateOptionParams
from mscheduler.exceptions import InvalidInput, TaskFailed, UnknownTask
from mscheduler.model import OptionChange, Task, TaskInfo, TaskOption, TaskStatus, validate_key

SEND_MANY_BATCH = 1000


class Publisher:
    """Sends tasks and reads their outcome.

    :param driver: the storage (``MongoDriver`` or ``MemoryDriver``).
    :param clock: time source; tests pass a ``FakeClock``.
    """

    def __init__(self, driver: Driver, *, clock: Clock | None = None) -> None:
        self.driver = driver
        self.clock: Clock = clock or SystemClock()
        self._set_up = False

    async def _setup(self) -> None:
        """Create the indexes before the first insert: uniqueness by key needs the unique index,
        and a publisher may write to a store no consumer has set up yet (SPEC F1)."""
        if not self._set_up:
            await self.driver.setup()
            self._set_up = True

    def _prepare(self, task: Task) -> NewTask:
        if not isinstance(task, Task):
            raise InvalidInput(f"send() takes a Task, got {type(task).__name__}")
        return NewTask(task.key, task.name, task.params, task.option.to_storage(self.clock.now()))

    async def send(self, task: Task, *, reset_finished: bool = False, session: Any = None) -> bool:
        """Publish ``task`` unless its key exists (SPEC F1); True if this call created (or reset) it.

        A task that exists is left alone, running or not; with ``reset_finished=True`` a task that
        ended (succeeded or failed) is reset to pending with the new params and options. Pass a
        PyMongo ``session`` to insert inside your own transaction (SPEC F20).
        """
        params = InsertParams([self._prepare(task)], self.clock.now(), reset_finished, session)
        await self._setup()
        return (await self.driver.insert_tasks(params))[0]

    async def send_many(
        self, tasks: Iterable[Task], *, reset_finished: bool = False, session: Any = None
    ) -> list[bool]:
        """Publish many tasks, one round trip per ``SEND_MANY_BATCH``; a bool per task, in order."""
        prepared = [self._prepare(t) for t in tasks]
        keys = [t.key for t in prepared]
        if len(set(keys)) != len(keys):
            raise InvalidInput("send_many got the same key twice")
        created: list[bool] = []
        await self._setup()
        for start in range(0, len(prepared), SEND_MANY_BATCH):
            batch = prepared[start : start + SEND_MANY_BATCH]
            params = InsertParams(batch, self.clock.now(), reset_finished, session)
            created.extend(await self.driver.insert_tasks(params))
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
        """Wait until the task ends; return its result or raise ``TaskFailed`` (SPEC F11).

        With ``concurrent_worker_cnt`` > 1 the result is the list of every worker's result.
        Raises ``TimeoutError`` after ``timeout`` seconds (None waits for ever).
        """
        started = self.clock.monotonic()
        interval = poll_interval
        while True:
            info = await self.get(key)
            if info.status is TaskStatus.SUCCEEDED:
                results = info.results
                return results[0] if info.option.concurrent_worker_cnt == 1 else results
            if info.status is TaskStatus.FAILED:
                error = info.last_error
                raise TaskFailed(key, error.model_dump() if error else None)
            waited = self.clock.monotonic() - started
            if timeout is not None and waited >= timeout:
                raise TimeoutError(f"task {key!r} is still {info.status.value} after {timeout}s")
            sleep = interval if timeout is None else min(interval, timeout - waited)
            await self.clock.sleep(sleep)
            interval = min(interval * 1.5, max_poll_interval)

    async def update_option(self, key: str, change: OptionChange) -> TaskOption:
        """Change a task's options while it may be running (SPEC F8); returns the new options.

        Removing a running worker from ``specific_worker_ids`` stops it at its next ping; a new
        ``ping_interval`` applies from the next ping; the rest applies to the next claim.
        """
        info = await self.get(key)
        try:
            option = change.apply(info.option)
        except ValidationError as exc:
            raise InvalidInput(f"invalid option change for {key!r}: {exc}") from exc
        stored = option.to_storage(info.create_time)
        if not await self.driver.update_option(UpdateOptionParams(key, stored, self.clock.now())):
            raise UnknownTask(key)
        return option


def _key(key: str) -> str:
    try:
        return validate_key(key)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
