"""The REST API: a thin HTTP layer over ``Operations`` (tasks, plans, flow limits, workers, stats,
health).

``create_app(operations=..., tokens=...)`` returns a FastAPI app to run on its own (``mscheduler
web``) or to mount in yours (``app.mount("/scheduler", create_app(...))``); its state lives on
``app.state``, not in module globals. Every route calls one ``Operations`` method and returns
what it returned: no query and no rule lives here.

Access: a bearer token on every request except ``/api/v1/health``, the OpenAPI schema and the
dashboard's static files (``/``, ``/ui/...``: ``mscheduler.web.dashboard``; they hold no data). A
read token may GET; changes need an admin token (403 otherwise); no or an unknown token is a 401
with ``WWW-Authenticate: Bearer``. The check runs before anything else, so an unauthenticated
request learns nothing about its input.

Errors are JSON ``{"error": ..., "detail": ...}``: bad input (``InvalidInput``, a body or
parameter the schema refuses, an unknown query parameter — ``?status[$ne]=x`` — or one given
twice) is a 422 and nothing is queried or written; an unknown task, plan or limit a 404; a refused
transition a 409 naming the task's status and the rule; a storage failure a 503 when retrying
may help (transient), a 500 otherwise.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BeforeValidator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mscheduler import __version__
from mscheduler.domain.exceptions import (
    InvalidInput,
    LeaseLost,
    MSchedulerError,
    StorageError,
    TransitionRefused,
    UnknownLimit,
    UnknownPlan,
    UnknownTask,
)
from mscheduler.domain.listing import CURSOR_MAX_LEN, LIST_LIMIT_MAX
from mscheduler.domain.model import OptionChange, TaskInfo, TaskOption, TaskStatus
from mscheduler.domain.plans import Plan, PlanInfo, PlanState
from mscheduler.operations import Operations
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web.auth import ApiTokens, Role
from mscheduler.web.dashboard import is_dashboard_path, mount_dashboard
from mscheduler.web.models import (
    CancelBody,
    ErrorOut,
    HealthOut,
    LimitIn,
    LimitOut,
    PlanEdit,
    StatsOut,
    StatusBody,
    StopOut,
    TaskPageOut,
    WhoAmIOut,
    WorkerOut,
)

API = "/api/v1"
OPENAPI_PATH = f"{API}/openapi.json"
HEALTH_PATH = f"{API}/health"
PUBLIC_PATHS = frozenset({OPENAPI_PATH, HEALTH_PATH})
METRICS_PATH = "/metrics"  # Prometheus (outside /api/v1: where scrapers look by default)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The health check's point read on the key index (a key no task is expected to have).
HEALTH_PROBE_KEY = "mscheduler:health-probe"

log = logging.getLogger("mscheduler.web")


class _ApiError(Exception):
    """An error answer: HTTP status, machine-readable code, a sentence (never a token)."""

    def __init__(
        self,
        status_code: int,
        error: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: str,
    ) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.error = error
        self.detail = detail
        self.headers = headers
        self.extra = extra

    def response(self) -> JSONResponse:
        body = ErrorOut(error=self.error, detail=self.detail, **self.extra)
        return JSONResponse(
            body.model_dump(mode="json", exclude_none=True), self.status_code, headers=self.headers
        )


def _unauthorized(detail: str) -> _ApiError:
    return _ApiError(401, "unauthorized", detail, headers={"WWW-Authenticate": 'Bearer realm="mscheduler"'})


# -- access ---------------------------------------------------------------------------------------


class TokenAuth:
    """ASGI middleware: the bearer token's role must allow the request's method (reads: GET,
    HEAD, OPTIONS; everything else: admin) — an executor token the executor routes and nothing
    else (``EXECUTOR_PATHS``). Runs before routing, parsing and validation."""

    def __init__(self, app: ASGIApp, tokens: ApiTokens, public: frozenset[str] = PUBLIC_PATHS) -> None:
        self.app = app
        self.tokens = tokens
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if path in self.public or is_dashboard_path(path):  # the dashboard's files hold no data
            await self.app(scope, receive, send)
            return
        error = self._refusal(scope)
        if error is not None:
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> _ApiError | None:
        values = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
        if len(values) != 1:
            return _unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        scheme, _, token = values[0].decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        role = self.tokens.role_of(token)
        if role is None:
            return _unauthorized("unknown token")
        if role is Role.EXECUTOR:  # the executor routes only, and nothing else (not even reads)
            if _scope_path(scope) not in EXECUTOR_PATHS:
                return _ApiError(403, "forbidden", "an executor token may only use /api/v1/executors/...")
        elif role is not Role.ADMIN and scope["method"] not in READ_METHODS:
            return _ApiError(403, "forbidden", "this token may only read; changes need an admin token")
        scope.setdefault("state", {})["role"] = role  # request.state.role: for GET /whoami
        return None


def _scope_path(scope: Scope) -> str:
    path: str = scope["path"]
    root = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


# The remote-executor routes (mscheduler.web.executors): the only ones an executor token may use.
EXECUTOR_PATHS = frozenset(f"{API}/executors/{action}" for action in ("lease", "ping", "report"))

# Declares the scheme in the OpenAPI schema; ``TokenAuth`` enforces it.
_bearer = HTTPBearer(auto_error=False, description="an admin or read token")


def _query_names(dependant: Any) -> set[str]:
    """The query parameters a route's dependency tree declares."""
    names = {field.alias for field in getattr(dependant, "query_params", ())}
    for sub in getattr(dependant, "dependencies", ()):
        names |= _query_names(sub)
    return names


def _allowed_query(request: Request) -> frozenset[str]:
    route = request.scope.get("route")
    names: frozenset[str] | None = getattr(route, "mscheduler_query", None)
    if names is None:
        names = frozenset(_query_names(getattr(route, "dependant", None)))
        if route is not None:
            route.mscheduler_query = names
    return names


async def known_query(request: Request) -> None:
    """Only the route's own query parameters, each at most once: anything else (``status[$ne]``,
    a repeated filter) is refused rather than ignored."""
    allowed = _allowed_query(request)
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in allowed:
            shown = name if len(name) <= 40 else name[:37] + "..."
            takes = ", ".join(sorted(allowed)) or "none"
            raise _ApiError(
                422, "invalid_input", f"unknown query parameter {shown!r} (this endpoint takes: {takes})"
            )
        if name in seen:
            raise _ApiError(422, "invalid_input", f"query parameter {name!r} given more than once")
        seen.add(name)


def ops(request: Request) -> Operations:
    operations: Operations = request.app.state.operations
    return operations


Ops = Annotated[Operations, Depends(ops)]


def _iso_text(value: object) -> object:
    """Times in queries are ISO-8601 text only (pydantic would also take 0.5 as a Unix time)."""
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError("an ISO-8601 time with its offset, e.g. 2030-01-01T00:00:00Z")
    return value


_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]")
IsoTime = Annotated[datetime, BeforeValidator(_iso_text)]
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in (
        (401, "no or unknown token"),
        (403, "a read token on a change"),
        (422, "invalid input: nothing was queried or changed"),
        (500, "a storage error retrying will not fix"),
        (503, "storage unavailable (transient): try again"),
    )
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "no such task, plan or worker"}
}
_REFUSED: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "refused by the status rules"}
}

_common = [Depends(_bearer), Depends(known_query)]
tasks = APIRouter(prefix="/tasks", tags=["tasks"], dependencies=_common, responses=_ERRORS)
plans = APIRouter(prefix="/plans", tags=["plans"], dependencies=_common, responses=_ERRORS)
limits = APIRouter(prefix="/limits", tags=["limits"], dependencies=_common, responses=_ERRORS)
workers = APIRouter(prefix="/workers", tags=["workers"], dependencies=_common, responses=_ERRORS)
misc = APIRouter(tags=["stats"], dependencies=_common, responses=_ERRORS)


# -- tasks ----------------------------------------------------------------------------------------


@tasks.get("", response_model=TaskPageOut, summary="List tasks (filters, cursor paging)")
async def list_tasks(
    operations: Ops,
    status: TaskStatus | None = None,
    name: str | None = None,
    key_prefix: Annotated[str | None, Query(description="tasks whose key starts so (key order)")] = None,
    worker_id: Annotated[str | None, Query(description="tasks with an attempt of this worker")] = None,
    created_from: Annotated[IsoTime | None, Query(description="created at or after (with offset)")] = None,
    created_to: Annotated[IsoTime | None, Query(description="created before (with offset)")] = None,
    finished_from: Annotated[
        IsoTime | None, Query(description="finished at or after (with offset): listed by finish time")
    ] = None,
    finished_to: Annotated[
        IsoTime | None, Query(description="finished before (with offset): listed by finish time")
    ] = None,
    group: Annotated[str | None, Query(description="tasks aimed at this worker group")] = None,
    cursor: Annotated[str | None, Query(max_length=CURSOR_MAX_LEN, description="next_cursor")] = None,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX)] = 100,
) -> TaskPageOut:
    """Tasks oldest first (with ``key_prefix``: in key order; with a finished range and no
    prefix: by finish time, finished tasks only), one page; ``next_cursor`` goes on."""
    page = await operations.page_tasks(
        status=status.value if status is not None else None,
        name=name,
        key_prefix=key_prefix,
        worker_id=worker_id,
        created_from=created_from,
        created_to=created_to,
        finished_from=finished_from,
        finished_to=finished_to,
        group=group,
        cursor=cursor,
        limit=limit,
    )
    return TaskPageOut(tasks=page.tasks, next_cursor=page.next_cursor)


@tasks.get("/{key:path}", response_model=TaskInfo, responses=_NOT_FOUND, summary="A task and its attempts")
async def get_task(key: str, operations: Ops) -> TaskInfo:
    return await operations.get_task(key)


@tasks.post("/{key:path}/cancel", response_model=TaskInfo, responses=_NOT_FOUND | _REFUSED)
async def cancel_task(key: str, operations: Ops, body: CancelBody | None = None) -> TaskInfo:
    """End a pending or running task as cancelled (a running handler stops at its next ping)."""
    return await operations.cancel(key, body.reason if body is not None else "")


@tasks.post("/{key:path}/pause", response_model=TaskInfo, responses=_NOT_FOUND | _REFUSED)
async def pause_task(key: str, operations: Ops, stop_running: bool = False) -> TaskInfo:
    """Stop claims of a pending or running task until it is resumed. ``stop_running=true``: its
    running attempts are also stopped and released (not counted against the retry budget); the
    resumed task runs again from its last checkpoint."""
    return await operations.pause(key, stop_running=stop_running)


@tasks.post("/{key:path}/resume", response_model=TaskInfo, responses=_NOT_FOUND | _REFUSED)
async def resume_task(key: str, operations: Ops) -> TaskInfo:
    """Make a paused task claimable again."""
    return await operations.resume(key)


@tasks.post("/{key:path}/restart", response_model=TaskInfo, responses=_NOT_FOUND | _REFUSED)
async def restart_task(key: str, operations: Ops, force: bool = False) -> TaskInfo:
    """Run a failed, cancelled or expired task again (a succeeded one with ``force=true``)."""
    return await operations.restart(key, force=force)


@tasks.post("/{key:path}/status", response_model=TaskInfo, responses=_NOT_FOUND | _REFUSED)
async def set_task_status(key: str, body: StatusBody, operations: Ops) -> TaskInfo:
    """Set a task's status by hand: ``succeeded`` (not running, not succeeded yet) or ``failed``
    (pending, nothing running). A child's parent follows (a sequential parent's next step
    starts); a parent's own status comes from its children (409: set a child's, by its key)."""
    return await operations.set_status(key, body.status, reason=body.reason, by="api")


@tasks.patch("/{key:path}/option", response_model=TaskOption, responses=_NOT_FOUND | _REFUSED)
async def edit_task(key: str, change: OptionChange, operations: Ops) -> TaskOption:
    """Change a pending or running task's options (fields left out stay); returns the new option."""
    return await operations.edit(key, change)


@tasks.delete("/{key:path}", status_code=204, responses=_NOT_FOUND | _REFUSED)
async def remove_task(key: str, operations: Ops, force: bool = False) -> Response:
    """Delete a task that is not running (a running one with ``force=true``: cancelled first)."""
    await operations.remove(key, force=force)
    return Response(status_code=204)


# -- plans ----------------------------------------------------------------------------------------


@plans.get("", response_model=list[PlanInfo], summary="List plans, oldest first")
async def list_plans(
    operations: Ops,
    state: PlanState | None = None,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX)] = 100,
    skip: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> list[PlanInfo]:
    return await operations.list_plans(state=state.value if state else None, limit=limit, skip=skip)


@plans.post("", response_model=PlanInfo, status_code=201, summary="Create a plan")
async def add_plan(plan: Plan, operations: Ops) -> PlanInfo:
    """Create a plan (an id that exists is refused: 422)."""
    return await operations.add_plan(plan)


@plans.get("/{plan_id}", response_model=PlanInfo, responses=_NOT_FOUND)
async def get_plan(plan_id: str, operations: Ops) -> PlanInfo:
    return await operations.get_plan(plan_id)


@plans.post("/{plan_id}/suspend", response_model=PlanInfo, responses=_NOT_FOUND)
async def suspend_plan(plan_id: str, operations: Ops) -> PlanInfo:
    return await operations.suspend_plan(plan_id)


@plans.post("/{plan_id}/resume", response_model=PlanInfo, responses=_NOT_FOUND)
async def resume_plan(plan_id: str, operations: Ops) -> PlanInfo:
    """Resume a suspended plan, or one parked in the error state."""
    return await operations.resume_plan(plan_id)


@plans.post("/{plan_id}/skip", response_model=PlanInfo, responses=_NOT_FOUND)
async def skip_plan(plan_id: str, operations: Ops, n: Annotated[int, Query(ge=0, le=10**9)] = 1) -> PlanInfo:
    """Skip the plan's next ``n`` occurrences (sets the count: 0 cancels earlier skips)."""
    return await operations.skip_plan(plan_id, n)


@plans.patch("/{plan_id}", response_model=PlanInfo, responses=_NOT_FOUND)
async def edit_plan(plan_id: str, edit: PlanEdit, operations: Ops) -> PlanInfo:
    """Change a plan's definition (fields left out stay; a new timing recomputes the next fire)."""
    return await operations.edit_plan(
        plan_id, **{field: getattr(edit, field) for field in edit.model_fields_set}
    )


@plans.delete("/{plan_id}", status_code=204, responses=_NOT_FOUND)
async def remove_plan(plan_id: str, operations: Ops) -> Response:
    """Delete a plan (the tasks it made stay)."""
    await operations.remove_plan(plan_id)
    return Response(status_code=204)


# -- flow limits ----------------------------------------------------------------------------------

_NO_LIMIT: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such limit"}}


@limits.get("", response_model=list[LimitOut], summary="Flow limits, with their running slots")
async def list_limits(operations: Ops) -> list[LimitOut]:
    return [LimitOut.of(info) for info in await operations.list_limits()]


@limits.get("/{key}", response_model=LimitOut, responses=_NO_LIMIT, summary="A flow limit and its state")
async def get_limit(key: str, operations: Ops) -> LimitOut:
    return LimitOut.of(await operations.get_limit(key))


@limits.put("/{key}", response_model=LimitOut, summary="Create or replace a flow limit")
async def set_limit(key: str, body: LimitIn, operations: Ops) -> LimitOut:
    """``max_running``, ``rate`` or both over ``names`` (default ``[key]``); applies to every
    consumer's next claim (their next limit refresh for new names). 422 for a name another
    limit covers."""
    info = await operations.set_limit(key, names=body.names, max_running=body.max_running, rate=body.rate)
    return LimitOut.of(info)


@limits.delete("/{key}", status_code=204, responses=_NO_LIMIT, summary="Remove a flow limit")
async def remove_limit(key: str, operations: Ops) -> Response:
    """Its names are unlimited from every consumer's next limit refresh."""
    await operations.remove_limit(key)
    return Response(status_code=204)


# -- workers, stats, health -----------------------------------------------------------------------


@workers.get("", response_model=list[WorkerOut], summary="Registered workers, oldest first")
async def list_workers(operations: Ops) -> list[WorkerOut]:
    return [WorkerOut.of(view) for view in await operations.list_workers()]


@workers.post("/{worker_id}/stop", response_model=StopOut, status_code=202, responses=_NOT_FOUND)
async def stop_worker(worker_id: str, operations: Ops) -> StopOut:
    """Ask a running worker to stop gracefully (it sees the request at its next heartbeat)."""
    if not await operations.request_worker_stop(worker_id):
        raise _ApiError(404, "not_found", f"no running worker with id {worker_id!r}")
    return StopOut(worker_id=worker_id, stop_requested=True)


@misc.get("/stats", response_model=StatsOut, summary="Task statistics (counts, rates, durations)")
async def stats(
    operations: Ops,
    window: Annotated[
        float | None, Query(ge=60, le=7 * 86400, description="seconds of the rates' window (default 1 h)")
    ] = None,
) -> StatsOut:
    """Counts by status, plus ``Operations.stats()`` (SPEC F27: success rates, duration
    percentiles, throughput over the window) in ``details``."""
    details = await operations.stats(window=window) if window is not None else await operations.stats()
    return StatsOut(counts=details.counts, total=details.total, details=details)


@misc.get("/whoami", response_model=WhoAmIOut, summary="The role of the presented token")
async def whoami(request: Request) -> WhoAmIOut:
    """What this token may do: the dashboard shows its action buttons to admin tokens only."""
    return WhoAmIOut(role=request.state.role)


health = APIRouter(tags=["health"])


@health.get(
    "/health",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "storage unavailable"}},
    summary="Liveness and storage reachability (no token needed)",
)
async def health_check(request: Request) -> JSONResponse:
    """``ok`` when the store answers a point read; 503 ``unavailable`` otherwise."""
    try:
        await ops(request).get_task(HEALTH_PROBE_KEY)
    except UnknownTask:
        pass
    except StorageError as exc:
        log.warning("health check: storage unavailable: %s", exc)
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})


# -- errors ---------------------------------------------------------------------------------------


def _validation_detail(exc: RequestValidationError) -> str:
    """Where and why, without echoing the input (it may be anything the client sent)."""
    reasons = []
    for error in exc.errors():
        loc = ".".join(str(part) for part in error.get("loc", ()))
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        reasons.append(f"{loc}: {message}" if loc else message)
    text = "; ".join(reasons) or "invalid request"
    return text if len(text) <= 1000 else text[:997] + "..."


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, _ApiError)
    return exc.response()


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _ApiError(422, "invalid_input", _validation_detail(exc)).response()


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own answers in the API's shape: no route (404), a body that is not JSON at
    all (400, made a 422 like every other refused input), a method the route lacks (405)."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        return _ApiError(422, "invalid_input", f"body: {exc.detail}").response()
    if exc.status_code == 404:
        return _ApiError(404, "not_found", "no such endpoint").response()
    error = "method_not_allowed" if exc.status_code == 405 else "http_error"
    return _ApiError(exc.status_code, error, str(exc.detail), headers=dict(exc.headers or {})).response()


async def _on_domain_error(request: Request, exc: Exception) -> JSONResponse:
    return domain_error(exc).response()


def domain_error(exc: Exception) -> _ApiError:
    """The HTTP answer of an error from ``Operations``."""
    if isinstance(exc, InvalidInput):
        return _ApiError(422, "invalid_input", str(exc))
    if isinstance(exc, (UnknownTask, UnknownPlan, UnknownLimit)):
        return _ApiError(404, "not_found", str(exc))
    if isinstance(exc, LeaseLost):  # a remote executor's report or ping after its lease moved on
        return _ApiError(409, "lease_lost", str(exc))
    if isinstance(exc, TransitionRefused):
        return _ApiError(409, "transition_refused", str(exc), status=exc.status, rule=exc.rule)
    if isinstance(exc, StorageError) and exc.transient:
        log.warning("storage unavailable: %s", exc)
        return _ApiError(
            503, "storage_unavailable", "storage unavailable; try again", headers={"Retry-After": "1"}
        )
    log.error("request failed: %s: %s", type(exc).__name__, exc)
    return _ApiError(500, "internal", "the server failed; see its log")


# -- the app --------------------------------------------------------------------------------------


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """At shutdown, the executors' outcomes and flow-limit slot releases still waiting are written
    (slots whose release is never written run out at their expiry)."""
    yield
    await app.state.executors.aclose()


class _MetricsEndpoint:
    """``Metrics.asgi_app()`` as a route's ASGI endpoint (a plain function would be taken for a
    request handler); a route, not a mount, so ``/metrics`` answers without a redirect."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.inner(scope, receive, send)


def _mount_metrics(app: FastAPI, operations: Operations) -> None:
    try:
        from mscheduler.observability.metrics import Metrics
    except ImportError:  # the metrics extra is not installed: no /metrics
        log.info("GET /metrics is off: pip install 'mscheduler[metrics]' for it")
        return
    app.state.metrics = Metrics(operations)
    endpoint = _MetricsEndpoint(app.state.metrics.asgi_app())
    app.router.routes.append(Route(METRICS_PATH, endpoint, methods=["GET"], include_in_schema=False))


def create_app(
    *,
    operations: Operations,
    tokens: ApiTokens,
    title: str = "mscheduler",
    metrics: bool = True,
    metrics_public: bool = False,
    dashboard: bool = True,
    executors: RemoteExecutors | None = None,
) -> FastAPI:
    """The REST API over ``operations`` (all routes under ``/api/v1``), guarded by ``tokens``.

    The OpenAPI schema is at ``/api/v1/openapi.json``; there is no docs page (FastAPI's loads
    its assets from a CDN): point any OpenAPI viewer at the schema. ``GET /metrics`` serves
    Prometheus metrics (``mscheduler.metrics``, when ``prometheus-client`` is installed) to a read
    token, or to anyone with ``metrics_public=True``; ``metrics=False`` leaves it out. The web
    dashboard (``mscheduler.web.dashboard``, a client of this API) is at ``/ui/``, and ``/``
    leads there; ``dashboard=False`` leaves it out. Remote executors lease, ping and report under
    ``/api/v1/executors`` (``mscheduler.web.executors``) through ``executors``, by default a
    ``RemoteExecutors`` over the operations' store and clock."""
    if not isinstance(operations, Operations):
        raise InvalidInput(f"operations: an Operations, got {type(operations).__name__}")
    if not isinstance(tokens, ApiTokens):
        raise InvalidInput(f"tokens: an ApiTokens, got {type(tokens).__name__}")
    app = FastAPI(
        title=title,
        lifespan=_lifespan,
        version=__version__,
        description="Look at and steer mscheduler's tasks, plans and workers.",
        openapi_url=OPENAPI_PATH,
        docs_url=None,
        redoc_url=None,
    )
    app.state.operations = operations
    app.state.executors = executors or RemoteExecutors(operations.driver, clock=operations.clock)
    from mscheduler.web.events import events as events_router
    from mscheduler.web.executors import executors as executors_router

    for router in (tasks, plans, limits, workers, misc, health, events_router, executors_router):
        app.include_router(router, prefix=API)
    public = PUBLIC_PATHS | ({METRICS_PATH} if metrics and metrics_public else set())
    if metrics:
        _mount_metrics(app, operations)
    if dashboard:
        mount_dashboard(app)
    app.add_exception_handler(_ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(MSchedulerError, _on_domain_error)
    app.add_middleware(TokenAuth, tokens=tokens, public=public)
    return app
