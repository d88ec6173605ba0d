"""``/api/v1/bulk``: one action (cancel, pause, resume, restart, remove) on many tasks.

On a list of keys it runs at once (``Operations.control_many``) and answers an outcome per key;
on a filter it runs in the background, page by page (``Operations.control_matching``, held by
``mscheduler.web.bulk``): 202 with a job whose progress and outcomes ``GET /bulk/{id}`` shows.
Each task is its own compare-and-set under the action's rule: a refusal is an outcome (with the
task's status and the rule), not an error. Changes need an admin token; a read token may follow
the jobs.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as FastPath

from mscheduler.operations import BulkOutcome
from mscheduler.web import bulk as jobs_module
from mscheduler.web.bulk import BulkJob, BulkJobs
from mscheduler.web.deps import COMMON_DEPENDENCIES, ERROR_ANSWERS, HttpError, Ops, Who, json_answer
from mscheduler.web.models import BulkIn, BulkJobOut, BulkOutcomeOut, BulkResultOut, ErrorOut

bulk = APIRouter(prefix="/bulk", tags=["bulk"], dependencies=COMMON_DEPENDENCIES, responses=ERROR_ANSWERS)

_NO_JOB: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such job here"}}


def _jobs(request: Request) -> BulkJobs:
    jobs: BulkJobs = request.app.state.bulk
    return jobs


def _outcomes(outcomes: list[BulkOutcome]) -> list[BulkOutcomeOut]:
    return [BulkOutcomeOut(key=o.key, outcome=o.outcome, status=o.status, rule=o.rule) for o in outcomes]


def _job_out(job: BulkJob, results_from: int = 0, results_limit: int = 1000) -> BulkJobOut:
    return BulkJobOut(
        id=job.id,
        action=job.action,
        filter={k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in job.filters.items()},
        by=job.by,
        state=job.state,
        matched=job.matched.count,
        matched_capped=job.matched.capped,
        processed=job.processed,
        done=job.done,
        refused=job.refused,
        unknown=job.unknown,
        started=job.started,
        ended=job.ended,
        error=job.error,
        results=_outcomes(job.results[results_from : results_from + results_limit]),
        results_total=len(job.results),
    )


@bulk.post(
    "",
    response_model=BulkResultOut,
    responses={202: {"model": BulkJobOut, "description": "a filter: the job started"}},
    summary="One action on many tasks (keys: at once; a filter: in the background)",
)
async def start_bulk(body: BulkIn, operations: Ops, who: Who, request: Request) -> Response:
    """``keys``: the action on each, an outcome per key (done; refused with the task's status
    and the rule; unknown). ``filter``: 202 and the job (``Location``: where to follow it);
    tasks created after it started are left alone. 429 when ``bulk.RUNNING_MAX`` jobs run already."""
    if (body.keys is None) == (body.filter_ is None):
        raise HttpError(422, "invalid_input", "give either keys or filter (one of them)")
    options: dict[str, Any] = {"reason": body.reason, "force": body.force, "stop_running": body.stop_running}
    if body.keys is not None:
        outcomes = await operations.control_many(body.action, body.keys, by=who.by, **options)
        counts = {kind: sum(o.outcome == kind for o in outcomes) for kind in ("done", "refused", "unknown")}
        return json_answer(BulkResultOut(action=body.action, results=_outcomes(outcomes), **counts))
    jobs = _jobs(request)
    if jobs.running() >= jobs_module.RUNNING_MAX:
        retry = str(request.app.state.limits.retry_after_seconds)
        detail = f"{jobs_module.RUNNING_MAX} bulk actions are running here: wait for one to end"
        raise HttpError(429, "too_many_jobs", detail, headers={"Retry-After": retry})
    assert body.filter_ is not None
    filters = body.filter_.model_dump(exclude_none=True)
    job = await jobs.start(operations, body.action, filters, options, by=who.by)
    response = json_answer(_job_out(job), status_code=202)
    response.headers["Location"] = f"bulk/{job.id}"
    return response


@bulk.get("", response_model=list[BulkJobOut], summary="The bulk actions this server ran, newest first")
async def list_bulk(request: Request) -> list[BulkJobOut]:
    return [_job_out(job, results_limit=0) for job in _jobs(request).all()]


# a job's id (``BulkJobs.start``: 16 hex digits): anything else is refused as bad input
JobId = Annotated[str, FastPath(pattern="^[0-9a-f]{1,64}$")]


@bulk.get("/{job_id}", response_model=BulkJobOut, responses=_NO_JOB, summary="A bulk action's progress")
async def get_bulk(
    job_id: JobId,
    request: Request,
    results_from: Annotated[int, Query(ge=0, le=10**6)] = 0,
    results_limit: Annotated[int, Query(ge=0, le=10_000)] = 1000,
) -> BulkJobOut:
    """Its state (running, done, stopped, failed), counts, and outcomes from ``results_from``."""
    job = _jobs(request).get(job_id)
    if job is None:
        raise HttpError(404, "not_found", "no such bulk action on this server (jobs live in its memory)")
    return _job_out(job, results_from, results_limit)


@bulk.post("/{job_id}/stop", response_model=BulkJobOut, status_code=202, responses=_NO_JOB)
async def stop_bulk(job_id: JobId, request: Request) -> BulkJobOut:
    """Stop after the page it is on (what was done stays done)."""
    jobs = _jobs(request)
    job = jobs.get(job_id)
    if job is None:
        raise HttpError(404, "not_found", "no such bulk action on this server (jobs live in its memory)")
    jobs.stop(job)
    return _job_out(job, results_limit=0)
