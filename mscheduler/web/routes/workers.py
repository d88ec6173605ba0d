"""``/api/v1/workers``: registered workers; ask one to stop."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from mscheduler.web.deps import COMMON_DEPENDENCIES, ERROR_ANSWERS, NOT_FOUND_ANSWER, HttpError, Ops
from mscheduler.web.models import StopOut, WorkerOut

workers = APIRouter(
    prefix="/workers", tags=["workers"], dependencies=COMMON_DEPENDENCIES, responses=ERROR_ANSWERS
)


@workers.get("", response_model=list[WorkerOut], summary="Registered workers, oldest first")
async def list_workers(
    operations: Ops,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=512, description="the X-Next-Cursor of a page")] = None,
    live: Annotated[bool, Query(description="only the live ones (running, seen within 30 s)")] = False,
) -> list[WorkerOut]:
    """A page of at most ``limit`` workers; a full page's ``X-Next-Cursor`` header goes on.
    Registrations not seen for a day (stopped, or a process that died) are gone."""
    views = await operations.list_workers(limit=limit, after=cursor, live=live)
    if len(views) == limit:
        response.headers["X-Next-Cursor"] = views[-1].cursor
    return [WorkerOut.of(view) for view in views]


@workers.post("/{worker_id}/stop", response_model=StopOut, status_code=202, responses=NOT_FOUND_ANSWER)
async def stop_worker(worker_id: str, operations: Ops) -> StopOut:
    """Ask a running worker to stop gracefully (it sees the request at its next heartbeat)."""
    if not await operations.request_worker_stop(worker_id):
        raise HttpError(404, "not_found", f"no running worker with id {worker_id!r}")
    return StopOut(worker_id=worker_id, stop_requested=True)
