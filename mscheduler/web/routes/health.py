"""``/api/v1/health``: liveness and storage reachability, no token needed."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from mscheduler.domain.exceptions import (
    StorageError,
    UnknownTask,
)
from mscheduler.web.deps import HEALTH_PROBE_KEY, log, ops
from mscheduler.web.models import HealthOut

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
