"""The Python clients of the REST API, over one httpx seam (``ApiHttp``): ``ExecutorClient`` for
remote executors (``/api/v1/executors``) and ``RemoteOperations``, ``Operations``'
methods backed by the API (the CLI's ``--api-url``).

Remote executors are for workers that do not speak MongoDB (another language, another network);
``ExecutorClient`` shows the protocol and serves Python programs that must go through HTTP::

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

``RemoteOperations(url, token)`` satisfies ``OperatorApi``, as ``Operations`` does, and
returns the same types, so every CLI command runs unchanged against either; the API's error
answers become the domain's exceptions again (422 ``InvalidInput``, 404 ``UnknownTask`` / ...,
409 ``TransitionRefused``, 5xx ``StorageError``) with the server's message. What the API's own
request checks would word differently is checked here first, by the same functions
``Operations`` uses. An API that cannot be reached, that refuses the token (401 / 403), or that
does not answer as an mscheduler API raises ``ApiUnreachable``, ``ApiRefused`` or ``NotAnApi``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel
from typing_extensions import Unpack

from mscheduler.domain.clock import Clock, SystemClock, sleep_unless
from mscheduler.domain.exceptions import (
    Fail,
    InvalidInput,
    LeaseLost,
    MSchedulerError,
    Retry,
    Snooze,
    StorageError,
    TransitionRefused,
    UnknownLimit,
    UnknownPlan,
    UnknownTask,
)
from mscheduler.domain.fairness import KeyWait, checked_key_waits_input
from mscheduler.domain.limits import Limit, LimitInfo, Rate
from mscheduler.domain.listing import TaskFilters, TaskPage, list_params
from mscheduler.domain.model import OptionChange, Task, TaskInfo, TaskOption, TaskStatus, WorkflowInfo
from mscheduler.domain.plans import Plan, PlanInfo, checked_plan_id
from mscheduler.domain.stats import DEFAULT_WINDOW as DEFAULT_STATS_WINDOW
from mscheduler.domain.stats import StatsStep, TaskStats
from mscheduler.domain.stats import checked_input as checked_stats_input
from mscheduler.drivers.base import WORKERS_PAGE_MAX
from mscheduler.operations import (
    BULK_ACTIONS,
    BULK_PAGE,
    COUNT_CAP,
    COUNT_MAX,
    MANY_AT_ONCE,
    MANY_MAX,
    BulkOutcome,
    HandlerInfo,
    RestartOutcome,
    TaskCount,
    WorkerView,
    checked_keys,
    checked_mark,
    checked_plan_listing,
    checked_reason,
    checked_skip_count,
    checked_worker_id,
    child_key_of,
    limit_input,
    restart_each,
    worker_cursor_position,
)
from mscheduler.publishing import checked_by
from mscheduler.runtime.consumer.runner import RunTimedOut
from mscheduler.services.events import Event, Events, checked_page

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


API_ROOT = "/api/v1"
API = f"{API_ROOT}/executors"
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
        self.http = api_http(base_url, token, transport, httpx.Timeout(timeout, read=timeout + wait_seconds))
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
            code, detail = error_of(response)
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


# -- the one HTTP seam -------------------------------------------------------------------------------


def api_http(
    base_url: str, token: str, transport: httpx.AsyncBaseTransport | None, timeout: httpx.Timeout
) -> httpx.AsyncClient:
    """An httpx client for the API at ``base_url`` (where it is served: ``http://host:port`` or
    the prefix it is mounted at), sending ``token`` as a bearer token."""
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        headers={"Authorization": f"Bearer {token}"},
        transport=transport,
        timeout=timeout,
    )


def error_of(response: httpx.Response) -> tuple[str, str]:
    """The API's error answer ``{"error", "detail"}`` as (code, detail); ``("", text)`` for an
    answer that does not have that shape (not the API, or a proxy in front of it)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str) and isinstance(body.get("detail"), str):
        return body["error"], body["detail"]
    return "", " ".join(response.text.split())[:200]


class ApiError(MSchedulerError):
    """The REST API could not be used: the base of the three below."""


class ApiUnreachable(ApiError):
    """Nothing answered at the API's address (refused, timed out, no such host)."""


class ApiRefused(ApiError):
    """The API refused the token (401: unknown or missing; 403: not allowed to do this)."""


class NotAnApi(ApiError):
    """Something answered, but not as an mscheduler API (another service, a proxy's error page)."""


# -- Operations over the REST API ----------------------------------------------------------------------

SEND_BATCH = 1000  # tasks per POST /api/v1/tasks (the API's own cap, MANY_MAX)


BULK_POLL_SECONDS = 0.2  # how often a bulk job that has nothing new is asked again


def _filter_query(filters: Any, extra: tuple[str, ...]) -> dict[str, Any]:
    """The listing filters (and ``extra`` of them: cursor, sort) as the API's query values."""
    query: dict[str, Any] = {}
    for name in ("status", "name", "key_prefix", "worker_id", "group", *extra):
        value = filters.get(name)
        if value is not None:
            query[name] = value
    for name in ("created_from", "created_to", "finished_from", "finished_to"):
        when = filters.get(name)
        if isinstance(when, datetime):
            query[name] = when.isoformat()
    return query


def _bulk_body(action: str, reason: str, force: bool, stop_running: bool, by: str | None) -> dict[str, Any]:
    """A bulk request's action and options, checked as ``Operations`` checks them."""
    if action not in BULK_ACTIONS:
        raise InvalidInput(f"action: one of {', '.join(BULK_ACTIONS)}, got {action!r}")
    for name, value in (("force", force), ("stop_running", stop_running)):
        if not isinstance(value, bool):
            raise InvalidInput(f"{name}: must be True or False")
    checked_reason(reason)
    checked_by(by)
    return {"action": action, "reason": reason, "force": force, "stop_running": stop_running}


def _outcome(data: dict[str, Any]) -> BulkOutcome:
    return BulkOutcome(data["key"], data["outcome"], status=data.get("status"), rule=data.get("rule"))


def _path(value: str) -> str:
    """A key or id as one path segment (a key may hold '/')."""
    return quote(value, safe="")


def _when(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _worker(data: dict[str, Any]) -> WorkerView:
    return WorkerView(
        worker_id=data["worker_id"],
        host=data["host"],
        pid=data["pid"],
        names=tuple(data["names"]),
        concurrency=data["concurrency"],
        start_time=datetime.fromisoformat(data["start_time"]),
        last_seen=datetime.fromisoformat(data["last_seen"]),
        running_cnt=data["running_cnt"],
        stop_requested=data["stop_requested"],
        stop_time=_when(data.get("stop_time")),
        live=data["live"],
        groups=tuple(data.get("groups") or ()),
    )


def _limit(data: dict[str, Any]) -> LimitInfo:
    rate = None
    if data.get("rate_n") is not None:
        rate = Rate(n=data["rate_n"], period=timedelta(seconds=data["rate_period_seconds"]))
    limit = Limit(key=data["key"], names=tuple(data["names"]), max_running=data["max_running"], rate=rate)
    holders = tuple(
        (h["worker_id"], h["attempt"], datetime.fromisoformat(h["expire_time"])) for h in data["holders"]
    )
    return LimitInfo(limit, data["running"], data["recent_starts"], holders, _when(data.get("update_time")))


class RemoteOperations:
    """``Operations`` over the REST API at ``base_url`` with ``token`` (see the module's docstring).

    The first call asks the API who the token is (``GET /api/v1/whoami``): an address where
    nothing answers, a refused token and something that is not an mscheduler API are told apart
    there (``ApiUnreachable``, ``ApiRefused``, ``NotAnApi``), before any change is sent.

    :param base_url: where the API is served (``http://host:port``, or the prefix it is mounted
        at; a trailing ``/api/v1`` is allowed).
    :param token: an admin token (read: reads only; publish: ``send`` only).
    :param transport: an httpx transport (tests: ``httpx.ASGITransport(app)``).
    :param timeout: seconds a request may take (connecting: at most 5).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 30.0,
    ) -> None:
        base = base_url.rstrip("/")
        base = base[: -len(API_ROOT)] if base.endswith(API_ROOT) else base
        if not base.startswith(("http://", "https://")):
            raise InvalidInput(f"api url: an http:// or https:// address, got {base_url!r}")
        self.base_url = base
        self.http = api_http(base, token, transport, httpx.Timeout(timeout, connect=min(timeout, 5.0)))
        self.role: str | None = None
        self.events = RemoteEvents(self)

    async def __aenter__(self) -> RemoteOperations:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- requests --------------------------------------------------------------------------------

    async def connect(self) -> str:
        """Ask the API what the token may do (once); returns its role."""
        if self.role is None:
            answer = await self._send("GET", "/whoami")
            role = answer.json().get("role") if _is_json(answer) and answer.status_code == 200 else None
            if answer.status_code != 200 or not isinstance(role, str):
                raise self._error(answer, "GET", "/whoami") or self._not_api(answer, "GET", "/whoami")
            self.role = role
        return self.role

    async def _send(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> httpx.Response:
        try:
            return await self.http.request(method, API_ROOT + path, params=params, json=body)
        except httpx.TimeoutException as exc:
            raise ApiUnreachable(
                f"the mscheduler API at {self.base_url} did not answer in time ({type(exc).__name__})"
            ) from exc
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise ApiUnreachable(f"cannot reach the mscheduler API at {self.base_url}: {reason}") from exc

    def _not_api(self, response: httpx.Response, method: str, path: str) -> NotAnApi:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        return NotAnApi(
            f"{self.base_url} does not answer as an mscheduler API ({method} {API_ROOT}{path}: "
            f"{response.status_code}, {kind})"
        )

    def _error(self, response: httpx.Response, method: str, path: str) -> MSchedulerError | None:
        """The exception an error answer stands for (None: not the API's error shape)."""
        code, detail = error_of(response)
        status = response.status_code
        if not code:
            return None
        if status in (401, 403):
            return ApiRefused(f"the mscheduler API at {self.base_url} refused the token: {detail}")
        if status == 404 and detail == "no such endpoint":
            return NotAnApi(
                f"the API at {self.base_url} has no {method} {API_ROOT}{path} (an older mscheduler?)"
            )
        if status in (413, 422):
            field = response.json().get("field") if _is_json(response) else None
            return InvalidInput(detail, field=field if isinstance(field, str) else None)
        if status in (429, 503):
            return StorageError(detail, transient=True)
        return StorageError(detail) if status >= 500 else None

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        missing: Callable[[], MSchedulerError] | None = None,
        refused: Callable[[dict[str, Any]], MSchedulerError] | None = None,
    ) -> Any:
        """One request; its JSON answer (None for 204), or the domain's exception for an error
        answer: ``missing()`` for a 404, ``refused(body)`` for a 409."""
        await self.connect()
        response = await self._send(method, path, params=params, body=body)
        if 200 <= response.status_code < 300:
            if response.status_code == 204:
                return None
            if not _is_json(response):
                raise self._not_api(response, method, path)
            return response.json()
        error = self._error(response, method, path)
        if error is not None:
            raise error
        code, detail = error_of(response)
        if not code:
            raise self._not_api(response, method, path)
        if response.status_code == 404 and missing is not None:
            raise missing()
        if response.status_code == 409 and refused is not None:
            raise refused(response.json())
        raise StorageError(f"{response.status_code} {code}: {detail}")

    async def _task_call(self, method: str, key: str, action: str, **request: Any) -> Any:
        """A request about task ``key``: 404 is ``UnknownTask``, 409 ``TransitionRefused``."""

        def refused(body: dict[str, Any]) -> MSchedulerError:
            error = TransitionRefused(key, action, str(body.get("status", "")), str(body.get("rule", "")))
            error.args = (body.get("detail", str(error)),)  # the server's words
            return error

        suffix = (
            f"/{action}" if action in ("cancel", "pause", "resume", "restart", "status", "option") else ""
        )
        return await self._call(
            method,
            f"/tasks/{_path(key)}{suffix}",
            missing=lambda: UnknownTask(key),
            refused=refused,
            **request,
        )

    # -- workers -----------------------------------------------------------------------------------

    async def list_workers(
        self, *, limit: int = WORKERS_PAGE_MAX, after: str | None = None, live: bool = False
    ) -> list[WorkerView]:
        if not isinstance(limit, int) or not 1 <= limit <= WORKERS_PAGE_MAX:
            raise InvalidInput(f"limit: must be an integer from 1 to {WORKERS_PAGE_MAX}")
        if after is not None:
            worker_cursor_position(after)  # the same refusal as Operations, before any request
        query: dict[str, Any] = {"limit": limit} | ({"cursor": after} if after is not None else {})
        if live:
            query["live"] = "true"
        return [_worker(w) for w in await self._call("GET", "/workers", params=query)]

    async def request_worker_stop(self, worker_id: str) -> bool:
        worker_id = checked_worker_id(worker_id)
        try:
            await self._call("POST", f"/workers/{_path(worker_id)}/stop", missing=lambda: UnknownTask(""))
        except UnknownTask:
            return False
        return True

    # -- flow limits -----------------------------------------------------------------------------------

    async def set_limit(
        self,
        key: str,
        *,
        names: Sequence[str] | None = None,
        max_running: int | None = None,
        rate: Rate | str | None = None,
    ) -> LimitInfo:
        limit = limit_input(key, names, max_running, rate)
        body = {
            "names": list(limit.names),
            "max_running": limit.max_running,
            "rate": str(limit.rate) if limit.rate is not None else None,
        }
        return _limit(await self._call("PUT", f"/limits/{_path(limit.key)}", body=body))

    async def get_limit(self, key: str) -> LimitInfo:
        return _limit(await self._call("GET", f"/limits/{_path(key)}", missing=lambda: UnknownLimit(key)))

    async def list_limits(self) -> list[LimitInfo]:
        return [_limit(item) for item in await self._call("GET", "/limits")]

    async def remove_limit(self, key: str) -> None:
        await self._call("DELETE", f"/limits/{_path(key)}", missing=lambda: UnknownLimit(key))

    # -- tasks -----------------------------------------------------------------------------------------

    async def list_handlers(self) -> list[HandlerInfo]:
        return [
            HandlerInfo(h["name"], h["workers"], h["params_schema"])
            for h in await self._call("GET", "/handlers")
        ]

    async def send(
        self, task: Task, *, reset_finished: bool = False, allow_unknown: bool = False, by: str | None = None
    ) -> bool:
        if not isinstance(task, Task):
            raise InvalidInput(f"send() takes a Task, got {type(task).__name__}")
        sent = await self.send_many([task], reset_finished=reset_finished, allow_unknown=allow_unknown, by=by)
        return sent[0]

    async def send_many(
        self,
        tasks: Sequence[Task],
        *,
        reset_finished: bool = False,
        allow_unknown: bool = False,
        by: str | None = None,
    ) -> list[bool]:
        """``POST /api/v1/tasks`` in batches of ``SEND_BATCH`` (each checked whole by the API, at
        the door as ``Operations.send_many``; the API records its token as ``by``)."""
        checked_by(by)
        if isinstance(tasks, (str, bytes, Task)) or not isinstance(tasks, Sequence):
            raise InvalidInput(f"tasks: a list of Tasks, got {type(tasks).__name__}")
        for i, task in enumerate(tasks):
            if not isinstance(task, Task):
                raise InvalidInput(f"send_many() takes Tasks, got {type(task).__name__} at index {i}")
        created: list[bool] = []
        params = {"reset_finished": "true"} if reset_finished else {}
        if allow_unknown:
            params["allow_unknown"] = "true"
        for start in range(0, len(tasks), SEND_BATCH):
            batch = [
                t.model_dump(mode="json", exclude_defaults=True) for t in tasks[start : start + SEND_BATCH]
            ]
            answer = await self._call("POST", "/tasks", params=params or None, body={"tasks": batch})
            created.extend(bool(item["created"]) for item in answer["tasks"])
        return created

    async def get_task(self, key: str) -> TaskInfo:
        return TaskInfo.model_validate(await self._task_call("GET", key, "get"))

    async def get_tasks(self, keys: Sequence[str]) -> dict[str, TaskInfo]:
        """``Operations.get_tasks``: one request per key, a few at a time; unknown keys are
        left out."""
        checked = checked_keys(keys)
        found: dict[str, TaskInfo] = {}

        async def one(key: str) -> None:
            with contextlib.suppress(UnknownTask):
                found[key] = await self.get_task(key)

        for start in range(0, len(checked), MANY_AT_ONCE):
            await asyncio.gather(*(one(key) for key in checked[start : start + MANY_AT_ONCE]))
        return {key: found[key] for key in checked if key in found}

    async def page_tasks(self, **filters: Unpack[TaskFilters]) -> TaskPage:
        checked = list_params(**filters)  # the same refusals as Operations, before any request
        query = _filter_query(filters, ("cursor", "sort")) | {"limit": checked.limit - 1}  # (one more)
        answer = await self._call("GET", "/tasks", params=query)
        tasks = [TaskInfo.model_validate(t) for t in answer["tasks"]]
        return TaskPage(tasks, answer["next_cursor"], answer.get("prev_cursor"))

    async def count_tasks(self, *, cap: int = COUNT_CAP, **filters: Unpack[TaskFilters]) -> TaskCount:
        """``Operations.count_tasks``: the total of a one-task page (``with_total``)."""
        if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= COUNT_MAX:
            raise InvalidInput(f"cap: an integer from 1 to {COUNT_MAX}")
        selected = {k: v for k, v in filters.items() if k not in ("cursor", "limit")}
        list_params(**selected)
        query = _filter_query(selected, ()) | {"limit": 1, "with_total": "true", "total_cap": cap}
        answer = await self._call("GET", "/tasks", params=query)
        return TaskCount(answer["total"], answer["total_capped"])

    async def list_tasks(self, **filters: Unpack[TaskFilters]) -> list[TaskInfo]:
        return (await self.page_tasks(**filters)).tasks

    async def count_by_status(self) -> dict[str, int]:
        counts: dict[str, int] = (await self._call("GET", "/stats"))["counts"]
        return counts

    async def stats(
        self,
        *,
        window: timedelta | float | None = DEFAULT_STATS_WINDOW,
        names: Sequence[str] | None = None,
        statuses: Sequence[str] | None = None,
        on_step: StatsStep | None = None,
    ) -> TaskStats:
        """``Operations.stats`` computed by the API (``window=None``: the API's default window)."""
        checked_window, checked_names, checked_statuses = checked_stats_input(window, names, statuses)
        query: dict[str, Any] = {}
        if checked_window is not None:
            query["window"] = checked_window.total_seconds()
        if checked_names:
            query["names"] = ",".join(checked_names)
        if checked_statuses:
            query["statuses"] = ",".join(checked_statuses)
        if on_step is not None:
            on_step("statistics (the API computes them)")
        return TaskStats.model_validate((await self._call("GET", "/stats", params=query))["details"])

    async def key_waits(self, *, names: Sequence[str] | None = None, limit: int = 100) -> list[KeyWait]:
        """``Operations.key_waits`` computed by the API."""
        checked_names, checked_limit = checked_key_waits_input(names, limit)
        query: dict[str, Any] = {"limit": checked_limit}
        if checked_names:
            query["names"] = ",".join(checked_names)
        answer = await self._call("GET", "/stats/keys", params=query)
        return [KeyWait.model_validate(row) for row in answer["keys"]]

    # The task controls take ``by`` as ``Operations``' do, checked alike; the API records the
    # token's name as the author of every change it makes, whatever ``by`` says.

    async def cancel(self, key: str, reason: str = "", *, by: str | None = None) -> TaskInfo:
        checked_reason(reason)
        checked_by(by)
        return TaskInfo.model_validate(await self._task_call("POST", key, "cancel", body={"reason": reason}))

    async def pause(self, key: str, *, stop_running: bool = False, by: str | None = None) -> TaskInfo:
        if not isinstance(stop_running, bool):
            raise InvalidInput("stop_running: must be True or False")
        checked_by(by)
        query = {"stop_running": "true" if stop_running else "false"}
        return TaskInfo.model_validate(await self._task_call("POST", key, "pause", params=query))

    async def resume(self, key: str, *, by: str | None = None) -> TaskInfo:
        checked_by(by)
        return TaskInfo.model_validate(await self._task_call("POST", key, "resume"))

    async def remove(self, key: str, *, force: bool = False, by: str | None = None) -> None:
        checked_by(by)
        await self._task_call("DELETE", key, "remove", params={"force": "true" if force else "false"})

    async def restart(
        self, key: str, *, force: bool = False, by: str | None = None, deadline: datetime | None = None
    ) -> TaskInfo:
        checked_by(by)
        query = {"force": "true" if force else "false"}
        if deadline is not None:
            if not isinstance(deadline, datetime) or deadline.tzinfo is None:
                raise InvalidInput("deadline: a timezone-aware datetime (e.g. datetime.now(UTC) + ...)")
            query["deadline"] = deadline.isoformat()
        return TaskInfo.model_validate(await self._task_call("POST", key, "restart", params=query))

    async def restart_many(
        self, keys: Sequence[str], *, force: bool = False, deadline: datetime | None = None
    ) -> dict[str, RestartOutcome]:
        """``restart`` of each key, a few at a time (one request each), under ``Operations``'s
        rules; the outcome per key, in the order given."""
        return await restart_each(
            checked_keys(keys), lambda key: self.restart(key, force=force, deadline=deadline)
        )

    async def control_many(
        self,
        action: str,
        keys: Sequence[str],
        *,
        reason: str = "",
        force: bool = False,
        stop_running: bool = False,
        by: str | None = None,
    ) -> list[BulkOutcome]:
        """``Operations.control_many`` in one ``POST /api/v1/bulk`` on the keys."""
        body = _bulk_body(action, reason, force, stop_running, by) | {"keys": checked_keys(keys)}
        answer = await self._call("POST", "/bulk", body=body)
        return [_outcome(item) for item in answer["results"]]

    async def control_matching(
        self,
        action: str,
        *,
        reason: str = "",
        force: bool = False,
        stop_running: bool = False,
        by: str | None = None,
        page_size: int = BULK_PAGE,
        **filters: Unpack[TaskFilters],
    ) -> AsyncIterator[list[BulkOutcome]]:
        """``Operations.control_matching`` run by the API (``POST /api/v1/bulk`` on the filter: a
        job the server runs page by page, at its own page size): yields the outcomes as the job
        reports them. Stopping the iteration stops the job after its page. The server keeps a
        job's first 10,000 outcomes: past them the job goes on, and nothing more is yielded."""
        body = _bulk_body(action, reason, force, stop_running, by)
        if not isinstance(page_size, int) or isinstance(page_size, bool) or not 1 <= page_size <= MANY_MAX:
            raise InvalidInput(f"page_size: an integer from 1 to {MANY_MAX}")
        selected = {k: v for k, v in filters.items() if k not in ("sort", "cursor", "limit")}
        list_params(**selected)  # the same refusals as Operations, before any request
        body["filter"] = _filter_query(selected, ())
        job = await self._call("POST", "/bulk", body=body)
        return self._follow_job(job["id"])

    async def _follow_job(self, job_id: str) -> AsyncIterator[list[BulkOutcome]]:
        """A bulk job's outcomes as they come, until it ends (stopped when the caller stops)."""
        seen, state = 0, "running"
        path = f"/bulk/{_path(job_id)}"
        try:
            while state == "running":
                job = await self._call("GET", path, params={"results_from": seen})
                state = job["state"]
                outcomes = [_outcome(item) for item in job["results"]]
                seen += len(outcomes)
                if outcomes:
                    yield outcomes
                elif state == "running":
                    await asyncio.sleep(BULK_POLL_SECONDS)
            if state == "failed":
                raise StorageError(f"the bulk action failed on the server: {job['error']}")
        finally:
            if state == "running":  # the caller stopped early: so does the job, after its page
                await self._call("POST", f"{path}/stop")

    async def edit(self, key: str, change: OptionChange, *, by: str | None = None) -> TaskOption:
        """``Operations.edit`` (the API records ``by`` as its own)."""
        if not isinstance(change, OptionChange):
            raise InvalidInput(f"change: an OptionChange, got {type(change).__name__}")
        body = change.model_dump(mode="json", include=change.model_fields_set)
        return TaskOption.model_validate(await self._task_call("PATCH", key, "option", body=body))

    async def set_status(self, key: str, status: str, *, reason: str = "", by: str = "operator") -> TaskInfo:
        """``Operations.set_status`` (the API records ``by`` as its own)."""
        checked_mark(status, reason, by)
        body = {"status": status, "reason": reason}
        return TaskInfo.model_validate(await self._task_call("POST", key, "status", body=body))

    async def set_child_status(
        self, key: str, child: str, status: str, *, reason: str = "", by: str = "operator"
    ) -> TaskInfo:
        if status == TaskStatus.CANCELLED.value:
            return await self.cancel(child_key_of(await self.get_task(key), child), reason)
        if status == TaskStatus.PENDING.value:
            return await self.restart(child_key_of(await self.get_task(key), child))
        checked_mark(status, reason, by)
        return await self.set_status(
            child_key_of(await self.get_task(key), child), status, reason=reason, by=by
        )

    async def restart_child(self, key: str, child: str, *, force: bool = False) -> TaskInfo:
        return await self.restart(child_key_of(await self.get_task(key), child), force=force)

    # -- workflows -------------------------------------------------------------------------------

    async def workflow(self, key: str) -> WorkflowInfo:
        answer = await self._call("GET", f"/workflows/{_path(key)}", missing=lambda: UnknownTask(key))
        return WorkflowInfo.model_validate(answer)

    async def restart_step(self, key: str, step: str, *, by: str | None = None) -> WorkflowInfo:
        """``Operations.restart_step`` (the API records ``by`` as its own)."""

        def refused(body: dict[str, Any]) -> MSchedulerError:
            error = TransitionRefused(
                key, "restart a step of", str(body.get("status", "")), str(body.get("rule", ""))
            )
            error.args = (body.get("detail", str(error)),)  # the server's words
            return error

        answer = await self._call(
            "POST",
            f"/workflows/{_path(key)}/restart-step",
            params={"step": step},
            missing=lambda: UnknownTask(key),
            refused=refused,
        )
        return WorkflowInfo.model_validate(answer)

    # -- plans -----------------------------------------------------------------------------------------

    async def _plan_call(self, method: str, plan_id: str, action: str = "", **request: Any) -> Any:
        plan_id = checked_plan_id(plan_id)
        path = f"/plans/{_path(plan_id)}" + (f"/{action}" if action else "")
        return await self._call(method, path, missing=lambda: UnknownPlan(plan_id), **request)

    async def add_plan(self, plan: Plan) -> PlanInfo:
        if not isinstance(plan, Plan):
            raise InvalidInput(f"add_plan() takes a Plan, got {type(plan).__name__}")
        return PlanInfo.model_validate(await self._call("POST", "/plans", body=plan.model_dump(mode="json")))

    async def get_plan(self, plan_id: str) -> PlanInfo:
        return PlanInfo.model_validate(await self._plan_call("GET", plan_id))

    async def list_plans(
        self, *, state: str | None = None, limit: int = 100, skip: int = 0
    ) -> list[PlanInfo]:
        checked = checked_plan_listing(state, limit, skip)
        query: dict[str, Any] = {"limit": limit, "skip": skip} | ({"state": checked} if checked else {})
        return [PlanInfo.model_validate(p) for p in await self._call("GET", "/plans", params=query)]

    async def run_plan_now(self, plan_id: str) -> TaskInfo:
        def refused(body: dict[str, Any]) -> MSchedulerError:
            error = TransitionRefused(
                plan_id, "run now", str(body.get("status", "")), str(body.get("rule", ""))
            )
            error.args = (body.get("detail", str(error)),)  # the server's words
            return error

        return TaskInfo.model_validate(await self._plan_call("POST", plan_id, "run", refused=refused))

    async def suspend_plan(self, plan_id: str) -> PlanInfo:
        return PlanInfo.model_validate(await self._plan_call("POST", plan_id, "suspend"))

    async def resume_plan(self, plan_id: str) -> PlanInfo:
        return PlanInfo.model_validate(await self._plan_call("POST", plan_id, "resume"))

    async def skip_plan(self, plan_id: str, n: int = 1) -> PlanInfo:
        n = checked_skip_count(n)
        return PlanInfo.model_validate(await self._plan_call("POST", plan_id, "skip", params={"n": n}))

    async def edit_plan(self, plan_id: str, **changes: Any) -> PlanInfo:
        body = {
            name: value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            for name, value in changes.items()
        }
        return PlanInfo.model_validate(await self._plan_call("PATCH", plan_id, body=body))

    async def remove_plan(self, plan_id: str) -> None:
        await self._plan_call("DELETE", plan_id)


class RemoteEvents:
    """``Events``' ``list`` and ``subscribe`` over the API (``/api/v1/events``, server-sent
    events for ``subscribe``). A store that keeps no event log lists nothing, as ``Events``."""

    def __init__(self, operations: RemoteOperations) -> None:
        self.operations = operations

    @staticmethod
    def _query(keys: Any, names: Any, kinds: Any, plans: Any, worker_id: str | None = None) -> dict[str, Any]:
        query = Events._query(keys, names, kinds, plans, worker_id)  # the same refusals as Events
        out: dict[str, Any] = {}
        for name, values in (("key", query.keys), ("name", query.names), ("plan", query.plan_ids)):
            if values:
                if len(values) > 1:
                    raise InvalidInput(f"{name}: one value over the REST API, got {len(values)}")
                out[name] = values[0]
        if query.kinds:
            out["kinds"] = ",".join(query.kinds)
        if worker_id is not None:
            out["worker_id"] = worker_id
        return out

    async def list(
        self,
        *,
        keys: Iterable[str] | str | None = None,
        names: Iterable[str] | str | None = None,
        kinds: Iterable[str] | str | None = None,
        plans: Iterable[str] | str | None = None,
        worker_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        skip: int = 0,
    ) -> list[Event]:
        checked_page(limit, skip)
        query = self._query(keys, names, kinds, plans, worker_id) | {"limit": limit, "skip": skip}
        for name, when in (("since", since), ("until", until)):
            if when is not None:
                if not isinstance(when, datetime) or when.tzinfo is None:
                    raise InvalidInput(f"{name}: a timezone-aware datetime")
                query[name] = when.isoformat()
        try:
            answer = await self.operations._call("GET", "/events", params=query, refused=_log_off)
        except _EventLogOff:
            return []
        return [Event.model_validate(e) for e in answer["events"]]

    def subscribe(
        self,
        *,
        names: Iterable[str] | str | None = None,
        kinds: Iterable[str] | str | None = None,
        keys: Iterable[str] | str | None = None,
        plans: Iterable[str] | str | None = None,
        since: datetime | None = None,
    ) -> AsyncIterator[Event]:
        query = self._query(keys, names, kinds, plans)
        if since is not None:
            if not isinstance(since, datetime) or since.tzinfo is None:
                raise InvalidInput("since: a timezone-aware datetime")
            query["since"] = since.isoformat()
        return self._stream(query)

    async def _stream(self, query: dict[str, Any]) -> AsyncIterator[Event]:
        ops = self.operations
        await ops.connect()
        path = f"{API_ROOT}/events/stream"
        try:
            async with ops.http.stream(
                "GET", path, params=query, timeout=httpx.Timeout(10.0, read=None)
            ) as answer:
                if answer.status_code != 200:
                    await answer.aread()
                    code, detail = error_of(answer)
                    if answer.status_code == 409 and code == "event_log_off":
                        raise _EventLogOff(detail)
                    raise ops._error(answer, "GET", "/events/stream") or ops._not_api(
                        answer, "GET", "/events/stream"
                    )
                data: list[str] = []
                async for line in answer.aiter_lines():
                    if line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif not line and data:
                        yield Event.model_validate_json("\n".join(data))
                        data = []
        except httpx.TransportError as exc:
            raise ApiUnreachable(
                f"the event stream of {ops.base_url} ended: {exc or type(exc).__name__}"
            ) from exc


class _EventLogOff(InvalidInput):
    """The API's store keeps no event log (409 ``event_log_off``)."""


def _log_off(body: dict[str, Any]) -> MSchedulerError:
    if body.get("error") == "event_log_off":
        return _EventLogOff(str(body.get("detail", "")))
    return StorageError(f"409 {body.get('error')}: {body.get('detail')}")


def _is_json(response: httpx.Response) -> bool:
    kind: str = response.headers.get("content-type", "")
    return kind.split(";")[0].strip() == "application/json"
