"""``/api/v1/workflows``: a task with children as a graph (each step's status, needs, a map step's
items by status) and the restart of one step with what depends on it."""

from __future__ import annotations

from fastapi import APIRouter

from mscheduler.domain.model import WorkflowInfo
from mscheduler.web.deps import COMMON_DEPENDENCIES, ERROR_ANSWERS, NOT_FOUND_ANSWER, REFUSED_ANSWER, Ops, Who

workflows = APIRouter(
    prefix="/workflows", tags=["workflows"], dependencies=COMMON_DEPENDENCIES, responses=ERROR_ANSWERS
)


@workflows.post(
    "/{key:path}/restart-step", response_model=WorkflowInfo, responses=NOT_FOUND_ANSWER | REFUSED_ANSWER
)
async def restart_step(key: str, step: str, operations: Ops, who: Who) -> WorkflowInfo:
    """Run the finished step ``step`` again, and every step that depends on it (409 while one of
    them is pending or running); returns the graph."""
    return await operations.restart_step(key, step, by=who.by)


@workflows.get(
    "/{key:path}", response_model=WorkflowInfo, responses=NOT_FOUND_ANSWER, summary="A workflow's graph"
)
async def get_workflow(key: str, operations: Ops) -> WorkflowInfo:
    """The steps of a task with children, in order: status, needs (a sequential step needs the
    one before it), the step a map step maps over, and a fanned-out map step's items by status;
    ``final``: the steps whose result ``wait`` returns."""
    return await operations.workflow(key)
