"""``/api/v1/plans``: list, create, show, suspend, resume, skip, edit, remove."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from mscheduler.domain.listing import LIST_LIMIT_MAX
from mscheduler.domain.model import TaskInfo
from mscheduler.domain.plans import Plan, PlanInfo, PlanState
from mscheduler.web.deps import COMMON_DEPENDENCIES, ERROR_ANSWERS, NOT_FOUND_ANSWER, REFUSED_ANSWER, Ops
from mscheduler.web.models import PlanEdit

plans = APIRouter(prefix="/plans", tags=["plans"], dependencies=COMMON_DEPENDENCIES, responses=ERROR_ANSWERS)


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


@plans.get("/{plan_id}", response_model=PlanInfo, responses=NOT_FOUND_ANSWER)
async def get_plan(plan_id: str, operations: Ops) -> PlanInfo:
    return await operations.get_plan(plan_id)


@plans.post(
    "/{plan_id}/run",
    response_model=TaskInfo,
    status_code=201,
    responses=NOT_FOUND_ANSWER | REFUSED_ANSWER,
    summary="Run the plan's task once, now",
)
async def run_plan_now(plan_id: str, operations: Ops) -> TaskInfo:
    """A run outside the schedule (keyed as the plan's occurrence now); the schedule and the
    counters stay. 409 when the plan does not allow overlap and its last run is still live."""
    return await operations.run_plan_now(plan_id)


@plans.post("/{plan_id}/suspend", response_model=PlanInfo, responses=NOT_FOUND_ANSWER)
async def suspend_plan(plan_id: str, operations: Ops) -> PlanInfo:
    return await operations.suspend_plan(plan_id)


@plans.post("/{plan_id}/resume", response_model=PlanInfo, responses=NOT_FOUND_ANSWER)
async def resume_plan(plan_id: str, operations: Ops) -> PlanInfo:
    """Resume a suspended plan, or one parked in the error state."""
    return await operations.resume_plan(plan_id)


@plans.post("/{plan_id}/skip", response_model=PlanInfo, responses=NOT_FOUND_ANSWER)
async def skip_plan(plan_id: str, operations: Ops, n: Annotated[int, Query(ge=0, le=10**9)] = 1) -> PlanInfo:
    """Skip the plan's next ``n`` occurrences (sets the count: 0 cancels earlier skips)."""
    return await operations.skip_plan(plan_id, n)


@plans.patch("/{plan_id}", response_model=PlanInfo, responses=NOT_FOUND_ANSWER)
async def edit_plan(plan_id: str, edit: PlanEdit, operations: Ops) -> PlanInfo:
    """Change a plan's definition (fields left out stay; a new timing recomputes the next fire)."""
    return await operations.edit_plan(
        plan_id, **{field: getattr(edit, field) for field in edit.model_fields_set}
    )


@plans.delete("/{plan_id}", status_code=204, responses=NOT_FOUND_ANSWER)
async def remove_plan(plan_id: str, operations: Ops) -> Response:
    """Delete a plan (the tasks it made stay)."""
    await operations.remove_plan(plan_id)
    return Response(status_code=204)
