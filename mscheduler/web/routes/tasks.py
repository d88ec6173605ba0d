"""``/api/v1/tasks``: send (one or a batch), list, show, cancel, pause, resume, restart, set a
status, edit, remove."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from mscheduler.domain.listing import CURSOR_MAX_LEN, LIST_LIMIT_MAX, TaskFilters
from mscheduler.domain.model import OptionChange, TaskInfo, TaskOption, TaskStatus
from mscheduler.operations import COUNT_CAP, COUNT_MAX
from mscheduler.web.deps import (
    COMMON_DEPENDENCIES,
    ERROR_ANSWERS,
    NOT_FOUND_ANSWER,
    REFUSED_ANSWER,
    HttpError,
    IsoTime,
    Ops,
    Who,
    json_answer,
    shown_task,
)
from mscheduler.web.models import (
    CancelBody,
    SendIn,
    SentManyOut,
    SentOut,
    StatusBody,
    TaskBatchIn,
    TaskPageOut,
)

tasks = APIRouter(prefix="/tasks", tags=["tasks"], dependencies=COMMON_DEPENDENCIES, responses=ERROR_ANSWERS)


@tasks.post(
    "",
    response_model=SentOut | SentManyOut,
    status_code=201,
    responses={200: {"model": SentOut | SentManyOut, "description": "nothing created: every key existed"}},
    summary="Send a task, or a batch (idempotent by key)",
)
async def send_tasks(
    body: SendIn,
    operations: Ops,
    who: Who,
    request: Request,
    reset_finished: Annotated[
        bool,
        Query(
            description="reset a task with this key that has ended (succeeded or failed): an admin "
            "token, or a publish token given may=reset"
        ),
    ] = False,
    allow_unknown: Annotated[
        bool, Query(description="send it even if no live worker handles its name (one is on its way)")
    ] = False,
) -> JSONResponse:
    """Send one task (the body is a task: ``key``, ``name``, ``params``, ``option``, ...) or many
    (``{"tasks": [...]}``), with ``Publisher.send`` / ``send_many``'s rules (``Operations.send``):
    a key that exists is left alone, params over the size cap, a key given twice or a key the
    scheduler makes itself (``plan:...``, ``<parent>/<child>``) refuse the request (422, nothing
    written). Checked at the door: a name no live worker handles is refused (422, naming the
    handled ones; ``allow_unknown=true`` sends it anyway), and params the handler's published
    JSON schema refuses are a 422 whose ``field`` is the path at fault. 201 when at least one
    task was created, 200 when none was; ``created`` says which. An admin or publish token;
    ``reset_finished`` needs an admin token or a publish token given ``may=reset`` (403). The
    ``sent`` events name the token (``by: api:<name>``)."""
    if reset_finished and not who.allows("reset"):
        raise HttpError(
            403,
            "forbidden",
            "reset_finished re-runs and rewrites a finished task: an admin token, or a publish token "
            "given may=reset",
        )
    count = len(body.tasks) if isinstance(body, TaskBatchIn) else 1
    request.app.state.publish_rate.take(who.name, count)
    if isinstance(body, TaskBatchIn):
        created = await operations.send_many(
            body.tasks, reset_finished=reset_finished, allow_unknown=allow_unknown, by=who.by
        )
        out: SentOut | SentManyOut = SentManyOut(
            tasks=[SentOut(key=t.key, created=c) for t, c in zip(body.tasks, created, strict=True)]
        )
    else:
        made = await operations.send(
            body, reset_finished=reset_finished, allow_unknown=allow_unknown, by=who.by
        )
        created = [made]
        out = SentOut(key=body.key, created=made)
    return JSONResponse(out.model_dump(mode="json"), status_code=201 if any(created) else 200)


@tasks.get("", response_model=TaskPageOut, summary="List tasks (filters, cursor paging)")
async def list_tasks(
    operations: Ops,
    who: Who,
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
    cursor: Annotated[
        str | None, Query(max_length=CURSOR_MAX_LEN, description="next_cursor or prev_cursor")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=LIST_LIMIT_MAX)] = 100,
    sort: Annotated[
        str | None,
        Query(
            max_length=20,
            description="created, updated, finished, status, name, attempts or key; '-' in front: "
            "descending (-created: newest first). Default: oldest first (by finish time with a "
            "finished range, key order with a key prefix, which allows only key / -key)",
        ),
    ] = None,
    with_total: Annotated[
        bool, Query(description="also count the tasks the filters select (up to total_cap)")
    ] = False,
    total_cap: Annotated[
        int, Query(ge=1, le=COUNT_MAX, description="with_total: count at most this many")
    ] = COUNT_CAP,
) -> Response:
    """Tasks oldest first (with ``key_prefix``: in key order; with a finished range and no
    prefix: by finish time, finished tasks only), or as ``sort`` says, one page;
    ``next_cursor`` goes on, ``prev_cursor`` back. A read token sees attempt tokens blanked."""
    filters = TaskFilters(
        status=status.value if status is not None else None,
        name=name,
        key_prefix=key_prefix,
        worker_id=worker_id,
        created_from=created_from,
        created_to=created_to,
        finished_from=finished_from,
        finished_to=finished_to,
        group=group,
        sort=sort,
        cursor=cursor,
        limit=limit,
    )
    page = await operations.page_tasks(**filters)
    tasks = [shown_task(info, who) for info in page.tasks]
    out = TaskPageOut(tasks=tasks, next_cursor=page.next_cursor, prev_cursor=page.prev_cursor)
    if with_total:
        counted = await operations.count_tasks(cap=total_cap, **filters)  # (cursor and limit do not count)
        out.total, out.total_capped = counted.count, counted.capped
    return json_answer(out)


@tasks.get(
    "/{key:path}", response_model=TaskInfo, responses=NOT_FOUND_ANSWER, summary="A task and its attempts"
)
async def get_task(key: str, operations: Ops, who: Who) -> Response:
    """The task (a read token sees its attempt tokens blanked)."""
    return json_answer(shown_task(await operations.get_task(key), who))


@tasks.post("/{key:path}/cancel", response_model=TaskInfo, responses=NOT_FOUND_ANSWER | REFUSED_ANSWER)
async def cancel_task(key: str, operations: Ops, who: Who, body: CancelBody | None = None) -> TaskInfo:
    """End a pending or running task as cancelled (a running handler stops at its next ping)."""
    return await operations.cancel(key, body.reason if body is not None else "", by=who.by)


@tasks.post("/{key:path}/pause", response_model=TaskInfo, responses=NOT_FOUND_ANSWER | REFUSED_ANSWER)
async def pause_task(key: str, operations: Ops, who: Who, stop_running: bool = False) -> TaskInfo:
    """Stop claims of a pending or running task until it is resumed. ``stop_running=true``: its
    running attempts are also stopped and released (not counted against the retry budget); the
    resumed task runs again from its last checkpoint."""
    return await operations.pause(key, stop_running=stop_running, by=who.by)


@tasks.post("/{key:path}/resume", response_model=TaskInfo, responses=NOT_FOUND_ANSWER | REFUSED_ANSWER)
async def resume_task(key: str, operations: Ops, who: Who) -> TaskInfo:
    """Make a paused task claimable again."""
    return await operations.resume(key, by=who.by)


@tasks.post("/{key:path}/restart", response_model=TaskInfo, responses=NOT_FOUND_ANSWER | REFUSED_ANSWER)
async def restart_task(
    key: str,
    operations: Ops,
    who: Who,
    force: bool = False,
    deadline: Annotated[IsoTime | None, Query(description="the new deadline (with offset)")] = None,
) -> TaskInfo:
    """Run a failed, cancelled or expired task again (a succeeded one with ``force=true``), with
    ``deadline`` (ISO-8601 with its offset) as its new deadline; without one, a deadline already
    past is dropped."""
    return await operations.restart(key, force=force, by=who.by, deadline=deadline)


@tasks.post("/{key:path}/status", response_model=TaskInfo, responses=NOT_FOUND_ANSWER | REFUSED_ANSWER)
async def set_task_status(key: str, body: StatusBody, operations: Ops, who: Who) -> TaskInfo:
    """Set a task's status by hand: ``succeeded`` (not running, not succeeded yet) or ``failed``
    (pending, nothing running). A child's parent follows (a sequential parent's next step
    starts); a parent's own status comes from its children (409: set a child's, by its key)."""
    return await operations.set_status(key, body.status, reason=body.reason, by=who.by)


@tasks.patch("/{key:path}/option", response_model=TaskOption, responses=NOT_FOUND_ANSWER | REFUSED_ANSWER)
async def edit_task(key: str, change: OptionChange, operations: Ops, who: Who) -> TaskOption:
    """Change a pending or running task's options (fields left out stay); returns the new option."""
    return await operations.edit(key, change, by=who.by)


@tasks.delete("/{key:path}", status_code=204, responses=NOT_FOUND_ANSWER | REFUSED_ANSWER)
async def remove_task(key: str, operations: Ops, who: Who, force: bool = False) -> Response:
    """Delete a task that is not running (a running one with ``force=true``: cancelled first)."""
    await operations.remove(key, force=force, by=who.by)
    return Response(status_code=204)
