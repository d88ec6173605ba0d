"""A small Python client of the remote-executor API (``/api/v1/executors``, SPEC F30).

Remote executors are for workers that do not speak MongoDB (another language, another network);
this client shows the protocol and serves Python programs that must go through HTTP::

    async with ExecutorClient("http://scheduler:8080", token, "exec-1", ["resize"]) as client:
        await client.run(handle)          # until client.stop() or an operator's remote stop

    async def handle(task: RemoteTask) -> Any:
        ...                               # raise Retry / Snooze / Fail as a consumer's handler would
        await task.checkpoint({"done": 10})
        return {"ok": True}

``run`` keeps ``concurrency`` handlers busy: it leases with a long poll when idle, pings every
running attempt in one request per ping interval (checkpoints and progress ride the ping), and
reports each outcome. An attempt whose ping says it is no longer ours (lost, revoked, cancelled,
paused) — or whose lease passes its end while pings fail — has its handler cancelled and
reports nothing. ``lease``, ``ping`` and ``report`` are the single requests, for other loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from mscheduler.domain.clock import Clock, SystemClock, sleep_unless
from mscheduler.domain.exceptions import (
    Fail,
    InvalidInput,
    LeaseLost,
    Retry,
    Snooze,
    StorageError,
    UnknownTask,
)
from mscheduler.runtime.consumer.runner import RunTimedOut

log = logging.getLogger("mscheduler.executor_client")


class ServerBusy(StorageError):
    """A 429: the server holds as many waiting leases as its caps allow (per token or in all);
    ``retry_after``: the seconds it asked the client to wait (``Retry-After``)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message, transient=True)
        self.retry_after = retry_after


def _retry_after(response: httpx.Response) -> float:
    """``Retry-After`` in seconds (1 to 60; 1 when missing or a date)."""
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 1.0), 60.0)
    except ValueError:
        return 1.0


API = "/api/v1/executors"
LEASE_MARGIN = 0.5  # seconds before a lease's end at which an unconfirmed attempt is given up
REPORT_TRIES = 5


@dataclass(slots=True)
class RemoteTask:
    """A leased attempt, as a handler sees it (``checkpoint_data``: what an earlier attempt saved)."""

    key: str
    name: str
    params: Any
    attempt: str
    attempt_no: int
    checkpoint_data: Any
    ping_interval: float
    lease_seconds: float
    run_timeout: float | None
    first_lease_seconds: float | None = None  # the lease the lease answer granted (may be shorter)
    _client: ExecutorClient | None = field(default=None, repr=False)
    _checkpoint: tuple[Any] | None = field(default=None, repr=False)
    _progress: dict[str, Any] | None = field(default=None, repr=False)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list, repr=False)
    _trusted_until: float = field(
        default=0.0, repr=False
    )  # the client clock's monotonic() at the lease's end
    _handler: asyncio.Task[None] | None = field(default=None, repr=False)
    _gone: str | None = field(default=None, repr=False)  # why the lease was given up

    @classmethod
    def of(cls, data: dict[str, Any], sent_at: float, client: ExecutorClient | None = None) -> RemoteTask:
        task = cls(
            key=data["key"],
            name=data["name"],
            params=data["params"],
            attempt=data["attempt"],
            attempt_no=data["attempt_no"],
            checkpoint_data=data["checkpoint"],
            ping_interval=data["ping_interval_seconds"],
            lease_seconds=data["lease_seconds"],
            run_timeout=data["run_timeout_seconds"],
            first_lease_seconds=data.get("first_lease_seconds"),
            _client=client,
        )
        first = task.lease_seconds if task.first_lease_seconds is None else task.first_lease_seconds
        task._trusted_until = sent_at + first - min(LEASE_MARGIN, first / 10)
        return task

    async def checkpoint(self, data: Any) -> None:
        """Save ``data`` on the task (sent with a ping now); returns once it is stored. Raises
        ``LeaseLost`` if the attempt no longer holds the task (nothing was saved)."""
        if self._client is None:
            raise InvalidInput("this task is not run by an ExecutorClient")
        if self._gone is not None:
            raise LeaseLost(f"the checkpoint was not saved: the attempt was {self._gone}")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._checkpoint = (data,)
        self._waiters.append(waiter)
        self._client._ping_now.set()
        await asyncio.shield(waiter)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Record how far the attempt is (0..1); sent with the next ping."""
        self._progress = {"fraction": fraction, "message": message}


Handler = Callable[[RemoteTask], Awaitable[Any]]


class ExecutorClient:
    """A remote executor over HTTP (see the module's docstring).

    :param base_url: where the API is served (``http://host:port``, or the prefix it is mounted at).
    :param token: an ``executor`` (or admin) token.
    :param worker_id: this executor's id (tasks may target it with ``specific_worker_ids``).
    :param names: the task names it runs.
    :param groups: the groups it belongs to (``Consumer(groups=...)``): it also runs tasks whose
        ``specific_groups`` name one of them.
    :param concurrency: handlers run at once.
    :param wait_seconds: how long a lease waits for work when nothing is due (long poll).
    :param transport: an httpx transport (tests: ``httpx.ASGITransport(app)``).
    :param clock: times pings and the local lease limit (tests: a ``FakeClock``).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        worker_id: str,
        names: Sequence[str],
        *,
        concurrency: int = 1,
        wait_seconds: float = 20.0,
        host: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 10.0,
        clock: Clock | None = None,
        groups: Sequence[str] = (),
    ) -> None:
        if concurrency < 1 or not 0 <= wait_seconds <= 60:
            raise InvalidInput("concurrency >= 1 and 0 <= wait_seconds <= 60")
        self.worker_id = worker_id
        self.names = list(names)
        self.groups = list(groups)
        self.concurrency = concurrency
        self.wait_seconds = wait_seconds
        self.host = host
        self.clock: Clock = clock or SystemClock()
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
            timeout=httpx.Timeout(timeout, read=timeout + wait_seconds),
        )
        self.requests = 0  # HTTP requests sent (the benchmark's count)
        self.stats = {"leased": 0, "reported": 0, "refused": 0, "lost": 0}
        self._running: dict[str, RemoteTask] = {}
        self._ping_now = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._stopping = False
        self._reports: set[asyncio.Task[None]] = set()
        self.stop_requested = False  # an operator asked this executor to stop (remote stop)

    async def __aenter__(self) -> ExecutorClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- single requests ----------------------------------------------------------------------

    async def _post(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        response = await self.http.post(f"{API}/{action}", json=body)
        if response.status_code != 200:
            try:
                error = response.json()
                code, detail = str(error.get("error", "")), str(error.get("detail", ""))
            except ValueError:
                code, detail = "http_error", response.text[:200]
            status = response.status_code
            if status == 409 and code == "lease_lost":
                raise LeaseLost(detail)
            if status == 404 and action == "report":
                raise UnknownTask(body.get("key", ""))
            if status >= 500:  # the server or its store failed: 503 says retrying may help
                raise StorageError(f"{status} {code}: {detail}", transient=status == 503)
            if status == 429:  # too many waits at once (the server's caps): back off as told
                raise ServerBusy(f"{status} {code}: {detail}", _retry_after(response))
            raise InvalidInput(f"{status} {code}: {detail}")
        answer: dict[str, Any] = response.json()
        return answer

    async def lease(self, max_tasks: int = 1, wait: float = 0.0) -> list[RemoteTask]:
        """Claim up to ``max_tasks`` due tasks, waiting up to ``wait`` seconds for one."""
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "names": self.names,
            "groups": self.groups,
            "max_tasks": max_tasks,
            "wait_seconds": wait,
            "running": len(self._running),
        }
        if self.host is not None:
            body["host"] = self.host
        sent = self.clock.monotonic()
        answer = await self._post("lease", body)
        self.stop_requested = self.stop_requested or bool(answer["stop_requested"])
        tasks = [RemoteTask.of(t, sent, self) for t in answer["tasks"]]
        self.stats["leased"] += len(tasks)
        return tasks

    async def ping(self, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Renew leases (``[{key, attempt, checkpoint?, progress?}]``); each answer's ``state``
        says whether the attempt is still ours (``alive``)."""
        body = {"worker_id": self.worker_id, "tasks": list(items), "groups": self.groups}
        answer = await self._post("ping", body)
        tasks: list[dict[str, Any]] = answer["tasks"]
        return tasks

    async def report(self, key: str, attempt: str, outcome: str, **fields: Any) -> dict[str, Any]:
        """Report an attempt's outcome (``succeeded`` with ``result``; ``failed`` with ``error``
        and ``retry_after`` / ``final``; ``snoozed`` with ``retry_after``; ``released``). Raises
        ``LeaseLost`` (409) when the lease moved on, ``UnknownTask`` (404)."""
        body = {"worker_id": self.worker_id, "key": key, "attempt": attempt, "outcome": outcome} | fields
        return await self._post("report", body)

    # -- the loop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop leasing; ``run`` returns once the running handlers finished and reported."""
        self._stopping = True
        self._slot_freed.set()

    async def run(self, handler: Handler) -> None:
        """Lease, run ``handler`` for each task, ping, report, until ``stop()`` (or a remote stop)."""
        pinger = asyncio.ensure_future(self._run_pinger())
        try:
            while not self._stopping and not self.stop_requested:
                free = self.concurrency - len(self._running)
                if free <= 0:
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                    continue
                try:
                    tasks = await self.lease(free, self.wait_seconds)
                except (httpx.TransportError, StorageError) as exc:
                    pause = exc.retry_after if isinstance(exc, ServerBusy) else 1.0
                    log.warning("lease failed (%s); trying again in %g s", exc, pause)
                    await self.clock.sleep(pause)
                    continue
                for task in tasks:
                    self._start(task, handler)
            while self._running or self._reports:
                await asyncio.wait(
                    [t._handler for t in self._running.values() if t._handler is not None] + [*self._reports]
                )
        except asyncio.CancelledError:  # cancelled itself: give the running attempts back
            for task in self._running.values():
                if task._handler is not None:
                    task._handler.cancel()
            raise
        finally:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger

    def _start(self, task: RemoteTask, handler: Handler) -> None:
        self._running[task.key] = task
        task._handler = asyncio.ensure_future(self._execute(task, handler))
        self._ping_now.set()  # the pinger learns the new interval

    async def _execute(self, task: RemoteTask, handler: Handler) -> None:
        fields: dict[str, Any]
        try:
            result = await self._call(task, handler)
            outcome, fields = "succeeded", {"result": result}
        except asyncio.CancelledError:
            if task._gone is None:  # cancelled from outside: give the attempt back
                task._gone = "released"
            outcome, fields = ("released", {}) if task._gone == "released" else ("", {})
        except Snooze as exc:
            outcome, fields = (
                "snoozed",
                {"retry_after": exc.after.total_seconds(), "error": {"message": str(exc)}},
            )
        except Retry as exc:
            outcome = "failed"
            fields = {
                "retry_after": exc.after.total_seconds(),
                "error": _error(type(exc).__name__, str(exc), exc),
            }
        except Fail as exc:
            outcome, fields = "failed", {"final": True, "error": _error(type(exc).__name__, str(exc), exc)}
        except Exception as exc:
            outcome, fields = "failed", {"error": _error(type(exc).__name__, str(exc), exc)}
        finally:
            self._running.pop(task.key, None)
            self._slot_freed.set()
        if outcome:
            send = asyncio.ensure_future(self._report(task, outcome, fields))
            self._reports.add(send)
            send.add_done_callback(self._reports.discard)

    async def _call(self, task: RemoteTask, handler: Handler) -> Any:
        """The handler, stopped after the task's run timeout (on the client's clock) if it has one."""
        if task.run_timeout is None:
            return await handler(task)
        run = asyncio.ensure_future(handler(task))
        timer = asyncio.ensure_future(self.clock.sleep(task.run_timeout))
        try:
            await asyncio.wait({run, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not run.done():
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                raise RunTimedOut(f"the attempt ran longer than its run_timeout ({task.run_timeout} s)")
        return run.result()

    async def _report(self, task: RemoteTask, outcome: str, fields: dict[str, Any]) -> None:
        delay = 0.2
        for n in range(REPORT_TRIES):
            try:
                await self.report(task.key, task.attempt, outcome, **fields)
                self.stats["reported"] += 1
                return
            except (LeaseLost, UnknownTask) as exc:
                self.stats["refused"] += 1
                log.warning("report of %s refused: %s", task.key, exc)
                return
            except InvalidInput as exc:  # the API refused the report itself (422, 401, 403)
                log.error("report of %s refused: %s", task.key, exc)
                return
            except (TypeError, ValueError) as exc:  # the result is not JSON: it cannot be sent
                if outcome != "succeeded":
                    log.error("report of %s cannot be sent: %s", task.key, exc)
                    return
                message = f"the handler's result cannot be sent as JSON: {exc}"
                outcome, fields = (
                    "failed",
                    {"final": True, "error": {"type": "ResultNotStorable", "message": message}},
                )
            except (httpx.TransportError, StorageError) as exc:
                log.warning("report of %s failed (%s); try %d of %d", task.key, exc, n + 1, REPORT_TRIES)
                await self.clock.sleep(delay)
                delay *= 2

    async def _run_pinger(self) -> None:
        while True:
            if not self._running:
                self._ping_now.clear()
                await self._ping_now.wait()
                continue
            now = self.clock.monotonic()
            interval = min(t.ping_interval for t in self._running.values())
            trust = min(t._trusted_until for t in self._running.values())
            if not self._ping_now.is_set():
                await sleep_unless(self.clock, max(0.0, min(interval, trust - now)), self._ping_now)
            self._ping_now.clear()
            await asyncio.sleep(0)  # let other handlers' checkpoints join this ping
            await self._ping_once()

    async def _ping_once(self) -> None:
        snapshot = {key: t for key, t in self._running.items() if t._gone is None}
        if not snapshot:
            return
        items, sent = [], {}
        for key, task in snapshot.items():
            item: dict[str, Any] = {"key": key, "attempt": task.attempt}
            if task._checkpoint is not None:
                item["checkpoint"] = task._checkpoint[0]
            if task._progress is not None:
                item["progress"] = task._progress
            sent[key] = (task._checkpoint, task._progress, task._waiters)
            task._checkpoint, task._progress, task._waiters = None, None, []
            items.append(item)
        started = self.clock.monotonic()
        try:
            answers = await self.ping(items)
        except (httpx.TransportError, StorageError) as exc:
            log.warning("ping failed: %s", exc)
            for key, task in snapshot.items():  # sent again with the next ping
                checkpoint, progress, waiters = sent[key]
                task._checkpoint = task._checkpoint or checkpoint
                task._progress = task._progress or progress
                task._waiters[:0] = waiters
                if task._trusted_until <= self.clock.monotonic():
                    self._lose(task, "lost")
            return
        for answer in answers:
            task = snapshot[answer["key"]]
            waiters = sent[answer["key"]][2]
            if answer["state"] == "alive":
                task.ping_interval = answer["ping_interval_seconds"]
                task._trusted_until = (
                    started + task.lease_seconds - min(LEASE_MARGIN, task.lease_seconds / 10)
                )
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            else:
                task._waiters[:0] = waiters
                self._lose(task, answer["state"])

    def _lose(self, task: RemoteTask, reason: str) -> None:
        """The attempt is not ours any more: cancel its handler, report nothing."""
        if task._gone is not None:
            return
        task._gone = reason
        self.stats["lost"] += 1
        log.warning("task %s: lease %s; cancelling its handler", task.key, reason)
        for waiter in task._waiters:
            if not waiter.done():
                waiter.set_exception(LeaseLost(f"the checkpoint was not saved: the attempt was {reason}"))
                waiter.exception()
        task._waiters = []
        if task._handler is not None:
            task._handler.cancel()


def _error(kind: str, message: str, exc: BaseException) -> dict[str, Any]:
    return {"type": kind, "message": message, "traceback": "".join(traceback.format_exception(exc))}
