"""``/api/v1/handlers``: the task names live workers handle, with their params' JSON schemas."""

from __future__ import annotations

from fastapi import APIRouter

from mscheduler.web.deps import COMMON_DEPENDENCIES, ERROR_ANSWERS, Ops
from mscheduler.web.models import HandlerOut

handlers = APIRouter(
    prefix="/handlers", tags=["handlers"], dependencies=COMMON_DEPENDENCIES, responses=ERROR_ANSWERS
)


@handlers.get("", response_model=list[HandlerOut], summary="Task names live workers handle")
async def list_handlers(operations: Ops) -> list[HandlerOut]:
    """Each task name a live worker handles (by name), how many live workers handle it, and the
    JSON schema of its params as published with their registration (null: a handler without a
    params model, or a remote executor): what ``POST /api/v1/tasks`` checks a send against, and
    what the dashboard's "new task" form is built from."""
    return [
        HandlerOut(name=h.name, workers=h.workers, params_schema=h.params_schema)
        for h in await operations.list_handlers()
    ]
