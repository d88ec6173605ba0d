"""The REST API's assembly: ``create_app`` puts the routers of ``web/routes/`` (one per resource),
the token middleware and the error answers (``web/deps.py``) and the dashboard together; a thin
HTTP layer over ``Operations``.

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

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mscheduler.domain.exceptions import (
    InvalidInput,
    MSchedulerError,
    error_reason,
)
from mscheduler.domain.version import __version__
from mscheduler.operations import Operations
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web.auth import ApiTokens
from mscheduler.web.bulk import BulkJobs
from mscheduler.web.dashboard import mount_dashboard
from mscheduler.web.deps import (
    API,
    METRICS_PATH,
    OPENAPI_PATH,
    PUBLIC_PATHS,
    HttpError,
    TokenAuth,
    domain_error,
    log,
)
from mscheduler.web.guards import (
    AnswerCache,
    ApiHeaders,
    ApiLimits,
    BodyLimit,
    SendRate,
    Slots,
    WorkerIds,
    too_large_detail,
)
from mscheduler.web.routes import ROUTERS

# -- errors ---------------------------------------------------------------------------------------


def _validation_detail(exc: RequestValidationError) -> str:
    """Where and why, without echoing the input (it may be anything the client sent)."""
    reasons = []
    for error in exc.errors():
        loc = ".".join(str(part) for part in error.get("loc", ()))
        message = error_reason(error)
        reasons.append(f"{loc}: {message}" if loc else message)
    text = "; ".join(reasons) or "invalid request"
    return text if len(text) <= 1000 else text[:997] + "..."


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HttpError)
    return exc.response()


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return HttpError(422, "invalid_input", _validation_detail(exc)).response()


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own answers in the API's shape: no route (404), a body that is not JSON at
    all (400, made a 422 like every other refused input), a method the route lacks (405)."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        return HttpError(422, "invalid_input", f"body: {exc.detail}").response()
    if exc.status_code == 404:
        return HttpError(404, "not_found", "no such endpoint").response()
    if exc.status_code == 413:  # guards.BodyTooLarge: the body passed the cap while it was read
        return HttpError(
            413, "payload_too_large", too_large_detail(request.app.state.limits.max_body_bytes)
        ).response()
    error = "method_not_allowed" if exc.status_code == 405 else "http_error"
    return HttpError(exc.status_code, error, str(exc.detail), headers=dict(exc.headers or {})).response()


async def _on_domain_error(request: Request, exc: Exception) -> JSONResponse:
    return domain_error(exc).response()


# -- the app --------------------------------------------------------------------------------------


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """At shutdown, the executors' outcomes and flow-limit slot releases still waiting are written
    (slots whose release is never written run out at their expiry)."""
    yield
    await app.state.bulk.aclose()  # the bulk actions stop after their page
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
    limits: ApiLimits | None = None,
) -> FastAPI:
    """The REST API over ``operations`` (all routes under ``/api/v1``), guarded by ``tokens``.

    The OpenAPI schema is at ``/api/v1/openapi.json``; there is no docs page (FastAPI's loads
    its assets from a CDN): point any OpenAPI viewer at the schema. ``GET /metrics`` serves
    Prometheus metrics (``observability.metrics``, when ``prometheus-client`` is installed) to a
    read token, or to anyone with ``metrics_public=True``; ``metrics=False`` leaves it out. The web
    dashboard (``mscheduler.web.dashboard``, a client of this API) is at ``/ui/``, and ``/``
    leads there; ``dashboard=False`` leaves it out. Remote executors lease, ping and report under
    ``/api/v1/executors`` (``mscheduler.web.routes.executors``) through ``executors``, by default a
    ``RemoteExecutors`` over the operations' store and clock. ``limits`` (``ApiLimits``): the cap
    on request bodies (413), on event streams and long-poll waits per token and in all (429),
    and how long ``/stats`` answers are reused."""
    if not isinstance(operations, Operations):
        raise InvalidInput(f"operations: an Operations, got {type(operations).__name__}")
    if not isinstance(tokens, ApiTokens):
        raise InvalidInput(f"tokens: an ApiTokens, got {type(tokens).__name__}")
    limits = ApiLimits() if limits is None else limits
    if not isinstance(limits, ApiLimits):
        raise InvalidInput(f"limits: an ApiLimits, got {type(limits).__name__}")
    for warning in tokens.warnings:
        log.warning("API tokens: %s", warning)
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
    app.state.limits = limits
    app.state.bulk = BulkJobs()
    app.state.stats_cache = AnswerCache(limits.stats_cache_seconds)
    app.state.streams = Slots("event streams", limits.streams_per_token, limits.streams_total)
    app.state.waits = Slots("waiting leases", limits.waits_per_token, limits.waits_total)
    app.state.publish_rate = SendRate(limits.publish_rate, limits.publish_burst)
    app.state.executor_workers = WorkerIds(limits.workers_per_token)
    app.state.executors = executors or RemoteExecutors(operations.driver, clock=operations.clock)
    for router in ROUTERS:
        app.include_router(router, prefix=API)
    public = PUBLIC_PATHS | ({METRICS_PATH} if metrics and metrics_public else set())
    if metrics:
        _mount_metrics(app, operations)
    if dashboard:
        mount_dashboard(app)
    app.add_exception_handler(HttpError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(MSchedulerError, _on_domain_error)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)  # after the token check
    app.add_middleware(TokenAuth, tokens=tokens, public=public)
    app.add_middleware(ApiHeaders)  # outermost: on every answer, refusals included
    return app
