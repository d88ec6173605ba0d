"""What the app and every router share: the API's paths, the token middleware (``TokenAuth``),
the error answer (``HttpError``, ``domain_error``: an ``Operations`` error as HTTP), the query
guard (``known_query``: unknown or repeated parameters are a 422) and the ``Ops`` dependency.
Routers import this module, never the app.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from mscheduler.domain.exceptions import (
    InvalidInput,
    LeaseLost,
    StorageError,
    TransitionRefused,
    UnknownLimit,
    UnknownPlan,
    UnknownTask,
)
from mscheduler.domain.model import TaskInfo
from mscheduler.operations import Operations
from mscheduler.web.auth import ApiTokens, Identity, Role
from mscheduler.web.dashboard import is_dashboard_path
from mscheduler.web.models import ErrorOut
from mscheduler.web.models import IsoTime as IsoTime  # for the routers

API = "/api/v1"


OPENAPI_PATH = f"{API}/openapi.json"


HEALTH_PATH = f"{API}/health"


PUBLIC_PATHS = frozenset({OPENAPI_PATH, HEALTH_PATH})


METRICS_PATH = "/metrics"  # Prometheus (outside /api/v1: where scrapers look by default)


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


# The health check's point read on the key index (a key no task is expected to have).
HEALTH_PROBE_KEY = "mscheduler:health-probe"


log = logging.getLogger("mscheduler.web")


class HttpError(Exception):
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


def _unauthorized(detail: str) -> HttpError:
    return HttpError(401, "unauthorized", detail, headers={"WWW-Authenticate": 'Bearer realm="mscheduler"'})


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

    def _refusal(self, scope: Scope) -> HttpError | None:
        values = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
        if len(values) != 1:
            return _unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        scheme, _, token = values[0].decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        identity = self.tokens.identify(token)
        if identity is None:
            return _unauthorized("unknown token")
        role = identity.role
        if role is Role.EXECUTOR:  # the executor routes only, and nothing else (not even reads)
            if _scope_path(scope) not in EXECUTOR_PATHS:
                return HttpError(403, "forbidden", "an executor token may only use /api/v1/executors/...")
        elif role is Role.PUBLISH:  # sending tasks (and asking what it may do), nothing else
            if (scope["method"], _scope_path(scope)) not in PUBLISH_REQUESTS:
                return HttpError(403, "forbidden", "a publish token may only send tasks (POST /api/v1/tasks)")
        elif role is not Role.ADMIN and scope["method"] not in READ_METHODS:
            return HttpError(403, "forbidden", "this token may only read; changes need an admin token")
        state = scope.setdefault("state", {})
        state["role"] = role  # request.state.role: for GET /whoami
        state["identity"] = identity  # who: the author of operator actions, the caps per token
        return None


def _scope_path(scope: Scope) -> str:
    path: str = scope["path"]
    root = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


# The remote-executor routes (mscheduler.web.routes.executors): the only ones an executor token may use.
EXECUTOR_PATHS = frozenset(f"{API}/executors/{action}" for action in ("lease", "ping", "report"))


# What a publish token may do: send tasks, ask its role (the CLI's first request) and which
# task names are handled, with their params' schemas.
PUBLISH_REQUESTS = frozenset({("POST", f"{API}/tasks"), ("GET", f"{API}/whoami"), ("GET", f"{API}/handlers")})


# Declares the scheme in the OpenAPI schema; ``TokenAuth`` enforces it.
bearer = HTTPBearer(auto_error=False, description="an admin or read token")


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
            raise HttpError(
                422, "invalid_input", f"unknown query parameter {shown!r} (this endpoint takes: {takes})"
            )
        if name in seen:
            raise HttpError(422, "invalid_input", f"query parameter {name!r} given more than once")
        seen.add(name)


async def identity_of(request: Request) -> Identity:
    """The presented token's identity (``TokenAuth`` checked it before routing)."""
    identity: Identity = request.state.identity
    return identity


Who = Annotated[Identity, Depends(identity_of)]


def ops(request: Request) -> Operations:
    operations: Operations = request.app.state.operations
    return operations


Ops = Annotated[Operations, Depends(ops)]


ERROR_ANSWERS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in (
        (401, "no or unknown token"),
        (403, "a read token on a change"),
        (422, "invalid input: nothing was queried or changed"),
        (500, "a storage error retrying will not fix"),
        (503, "storage unavailable (transient): try again"),
    )
}


NOT_FOUND_ANSWER: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "no such task, plan or worker"}
}


REFUSED_ANSWER: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "refused by the status rules"}
}


COMMON_DEPENDENCIES = [Depends(bearer), Depends(known_query)]


def domain_error(exc: Exception) -> HttpError:
    """The HTTP answer of an error from ``Operations``."""
    if isinstance(exc, InvalidInput):
        if exc.field:
            return HttpError(422, "invalid_input", str(exc), field=exc.field)
        return HttpError(422, "invalid_input", str(exc))
    if isinstance(exc, (UnknownTask, UnknownPlan, UnknownLimit)):
        return HttpError(404, "not_found", str(exc))
    if isinstance(exc, LeaseLost):  # a remote executor's report or ping after its lease moved on
        return HttpError(409, "lease_lost", str(exc))
    if isinstance(exc, TransitionRefused):
        return HttpError(409, "transition_refused", str(exc), status=exc.status, rule=exc.rule)
    if isinstance(exc, StorageError) and exc.transient:
        log.warning("storage unavailable: %s", exc)
        return HttpError(
            503, "storage_unavailable", "storage unavailable; try again", headers={"Retry-After": "1"}
        )
    log.error("request failed: %s: %s", type(exc).__name__, exc)
    return HttpError(500, "internal", "the server failed; see its log")


def json_answer(value: BaseModel, status_code: int = 200) -> Response:
    """The model as JSON, serialized once: what ``response_model`` would send, without
    validating the model a second time (a page of 100 tasks costs half as much)."""
    return Response(value.model_dump_json(), status_code=status_code, media_type="application/json")


def shown_task(info: TaskInfo, who: Identity) -> TaskInfo:
    """The task as ``who`` may see it: a read token gets its attempt tokens blanked (``""``);
    a worker pings and reports an attempt with its token."""
    if who.role is Role.ADMIN:
        return info
    return info.model_copy(
        update={
            "worker_states": [w.model_copy(update={"attempt": ""}) for w in info.worker_states],
            "checkpoint": info.checkpoint.model_copy(update={"attempt": ""}) if info.checkpoint else None,
            "progress": info.progress.model_copy(update={"attempt": ""}) if info.progress else None,
        }
    )
