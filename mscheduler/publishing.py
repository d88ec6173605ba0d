"""Publishing, written once: what ``Publisher.send`` / ``send_many`` and ``Operations.send`` /
``send_many`` (the REST API's ``POST /api/v1/tasks``) both call, so that a task sent from Python
and one sent over HTTP meet the same validation, size cap and idempotency by key.

``publish`` turns ``Task`` objects into the documents to insert (a task with children: the
parent, then its children, in one command), refuses bad input before anything is written, and
inserts in batches of about ``SEND_MANY_BATCH`` documents; it returns, per task, whether it was
created. It sits below the runtime and beside nothing: the publisher adds its listeners, tracing
and the "no live worker handles this name" warning on top.

May import: ``mscheduler.drivers`` and ``mscheduler.domain``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from mscheduler.domain.exceptions import InvalidInput, KeyTaken
from mscheduler.domain.family import GRAPH, SEQUENTIAL, MapExpansion
from mscheduler.domain.model import DEFAULT_MAX_PARAMS_BYTES as DEFAULT_MAX_PARAMS_BYTES
from mscheduler.domain.model import (
    Child,
    Task,
    TaskOption,
    TaskStatus,
    checked_params_size,
    child_key,
    encoded_size,
    item_key,
    reserved_key,
    step_needs,
)
from mscheduler.domain.plans import occurrence_key, run_task
from mscheduler.domain.unique import params_hash
from mscheduler.drivers.base import (
    Driver,
    ExpandMapParams,
    InsertParams,
    MarkParams,
    NewTask,
    SyncParentsParams,
)

SEND_MANY_BATCH = 1000  # documents per insert command
# a batch's option objects and their storage forms, by id (``prepare``)
StoredOptions = dict[int, tuple[TaskOption, dict[str, Any]]]
MAX_PARAMS_BYTES_LIMIT = 8 * 1024 * 1024


BY_MAX = 200  # characters of a sender's name (``by``)


def checked_by(by: object) -> str | None:
    """Who sends (``by``): a short line of text, or None."""
    if by is None:
        return None
    if not isinstance(by, str) or not by or len(by) > BY_MAX or not by.isprintable():
        raise InvalidInput(f"by: a name of 1 to {BY_MAX} printable characters")
    return by


def checked_max_params_bytes(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARAMS_BYTES_LIMIT:
        raise InvalidInput("max_params_bytes must be between 1 byte and 8 MiB")
    return value


def prepare(
    task: Task,
    now: datetime,
    max_params_bytes: int,
    trace: Mapping[str, str] | None = None,
    stored_options: StoredOptions | None = None,
) -> NewTask:
    """One task as the document to insert: its params within ``max_params_bytes`` (their BSON
    size), its option in storage form, its unique hash when ``unique_by="params"``.

    ``stored_options``: the storage forms made so far in this batch, by option object: the tasks
    of one batch sent with one ``TaskOption`` (most often the default) share one stored option
    (a driver copies what it sends; the memory driver keeps it shared, never changing a stored
    option in place)."""
    if not isinstance(task, Task):
        raise InvalidInput(f"send() takes a Task, got {type(task).__name__}")
    if encoded_size(task.params) > max_params_bytes:  # a plan's too; the message built only then
        checked_params_size(task.params, max_params_bytes, f"task {task.key!r}")
    unique_hash = params_hash(task.name, task.params) if task.unique_by == "params" else None
    if stored_options is None:
        option = task.option.to_storage(now)
    else:
        held = stored_options.get(id(task.option))
        if held is None or held[0] is not task.option:  # held: the id is not reused meanwhile
            held = stored_options[id(task.option)] = (task.option, task.option.to_storage(now))
        option = held[1]
    return NewTask(task.key, task.name, task.params, option, unique_hash=unique_hash, trace=trace)


def expand(task: Task, prepare_one: Callable[[Task], NewTask]) -> list[NewTask]:
    """A task with children as the documents to insert in one command, the parent first.

    Each child is a ``Task`` of its own (key ``<parent key>/<name>``, handler ``name``, its params
    or the parent's, its option or the parent's), prepared as any task is (``prepare_one``: the
    size checks and storage form); in sequential mode all but the first are ``blocked``, in a
    graph every step that needs another (a map step: the step it maps over) is
    (``mscheduler.services.children`` keeps the family in step afterwards).
    """
    children = task.children or ()
    mode = task.mode or SEQUENTIAL
    keys = [child_key(task.key, c.name) for c in children]
    key_of = dict(zip([c.name for c in children], keys, strict=True))
    definition: dict[str, Any] = {"mode": mode, "names": [c.name for c in children], "keys": keys}
    if mode == GRAPH:
        definition["needs"] = [list(step_needs(c)) for c in children]
        definition["maps"] = [_map_of(c) for c in children]
    out = [replace(prepare_one(task), children=definition)]
    for position, (child, key) in enumerate(zip(children, keys, strict=True)):
        params = child.params if child.params is not None else task.params
        prepared = prepare_one(Task(key, child.name, params, option=child.option_for(task.option)))
        blocked = position > 0 if mode == SEQUENTIAL else mode == GRAPH and bool(step_needs(child))
        prepared = replace(prepared, parent=task.key, position=position, blocked=blocked)
        if mode == GRAPH:
            needs = [{"name": n, "key": key_of[n]} for n in child.needs]
            map_ = _map_of(child)
            prepared = replace(prepared, needs=needs or None, map=map_)
        out.append(prepared)
    return out


def _map_of(child: Child) -> dict[str, Any] | None:
    if child.map_over is None:
        return None
    return {"over": child.map_over, "on_failure": child.on_failure, "max_items": child.max_items}


def run_documents(plan_id: str, fire_time: datetime, template: Mapping[str, Any]) -> list[NewTask]:
    """The documents of a plan's run at ``fire_time`` (its template: a plan's ``task``): one task,
    or a task with children (the parent first), each keyed by the occurrence. The run (the task,
    or the parent) records its plan (``plan_id``): a planner that finds its run key held by a task
    it did not make knows it is not its own run."""
    if not template.get("children"):
        option = TaskOption.from_storage(template["option"])
        key = occurrence_key(plan_id, fire_time)
        return [
            NewTask(
                key, template["name"], template.get("params"), option.to_storage(fire_time), plan_id=plan_id
            )
        ]
    task = run_task(plan_id, fire_time, template)
    run, *children = expand(
        task, lambda one: NewTask(one.key, one.name, one.params, one.option.to_storage(fire_time))
    )
    return [replace(run, plan_id=plan_id), *children]


def child_names(task: Task) -> list[str]:
    """The handler names a task needs: its children's, or its own."""
    return [c.name for c in task.children] if task.children else [task.name]


def family(task: Task, reset_finished: bool, prepare_one: Callable[[Task], NewTask]) -> list[NewTask]:
    """The documents a task is stored as: itself, or with children the parent first, then its
    children, inserted in one command."""
    if not isinstance(task, Task) or not task.children:
        return [prepare_one(task)]
    if reset_finished:
        raise InvalidInput(
            f"task {task.key!r}: reset_finished does not apply to a task with children "
            "(restart it with Operations.restart)"
        )
    if task.unique_by != "key":
        raise InvalidInput(f"task {task.key!r}: unique_by='params' does not apply to a task with children")
    return expand(task, prepare_one)


def batches(families: list[list[NewTask]], limit: int | None = None) -> list[list[list[NewTask]]]:
    """Families grouped into insert commands of about ``limit`` documents (``SEND_MANY_BATCH``
    by default); a family (a parent and its children) is never split between two commands."""
    limit = SEND_MANY_BATCH if limit is None else limit
    grouped: list[list[list[NewTask]]] = []
    size = limit
    for one in families:
        if size + len(one) > limit:
            grouped.append([])
            size = 0
        grouped[-1].append(one)
        size += len(one)
    return grouped


def prepared_families(
    tasks: Sequence[Any],
    *,
    now: datetime,
    reset_finished: bool,
    max_params_bytes: int,
    trace: Mapping[str, str] | None = None,
) -> list[list[NewTask]]:
    """Every task checked and prepared before anything is written: a non-``Task`` (named by its
    position), params over the cap, a key given twice (children included), a key the scheduler
    makes itself (``reserved_key``: a plan's run, a child's) are ``InvalidInput``."""
    for i, task in enumerate(tasks):
        if not isinstance(task, Task):
            raise InvalidInput(f"send_many() takes Tasks, got {type(task).__name__} at index {i}")
        reason = reserved_key(task.key)
        if reason is not None:
            raise InvalidInput(f"task {task.key!r} cannot be sent: {reason}")
    if len(tasks) == 1 and not tasks[0].children:  # one send: no batch to share options or repeat a key
        return [[prepare(tasks[0], now, max_params_bytes, trace)]]

    stored_options: StoredOptions = {}

    def prepare_one(one: Task) -> NewTask:
        return prepare(one, now, max_params_bytes, trace, stored_options)

    families = [family(t, reset_finished, prepare_one) if t.children else [prepare_one(t)] for t in tasks]
    keys = [t.key for one in families for t in one]
    if len(set(keys)) < len(keys):
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                raise InvalidInput(f"send_many got the key {key!r} twice")
            seen.add(key)
    return families


async def check_children_free(driver: Driver, families: list[list[NewTask]]) -> None:
    """A parent never adopts a task it did not make: ``KeyTaken`` when one of its children's
    keys is held by a task that is not that parent's child (one read, of the children's keys,
    and only for sends with children)."""
    parent_of = {t.key: t.parent for one in families if len(one) > 1 for t in one[1:]}
    if not parent_of:
        return
    for doc in await driver.get_tasks(list(parent_of)):
        if doc.get("parent") != parent_of[doc["key"]]:
            raise KeyTaken(doc["key"], f"parent {parent_of[doc['key']]!r}")


async def insert_families(
    driver: Driver,
    families: list[list[NewTask]],
    now: Callable[[], datetime],
    *,
    reset_finished: bool = False,
    session: Any = None,
    by: str | None = None,
) -> list[bool]:
    """Insert prepared families, one command per batch; per family, whether its first document
    (the task, or a parent) was created (or reset). A driver's ``insert_batch`` makes its
    batches smaller (the memory driver's: others run between them). ``by``: who sends (the
    ``sent`` events and a reset's history say so). A child's key held by another task refuses
    the whole send (``check_children_free``), before anything is written."""
    await check_children_free(driver, families)
    created: list[bool] = []
    limit = min(SEND_MANY_BATCH, getattr(driver, "insert_batch", SEND_MANY_BATCH))
    for n, batch in enumerate(batches(families, limit)):
        if n:
            await asyncio.sleep(0)  # a store that never waits still lets the loop turn between batches
        docs = [t for one in batch for t in one]
        results = await driver.insert_tasks(InsertParams(docs, now(), reset_finished, session, by))
        first = 0
        for one in batch:
            created.append(results[first])
            first += len(one)
    return created


# -- keeping families in step (a sync, then what it left to do) ------------------------------------

SYNC_ROUNDS = 4  # a workflow nests two deep (workflow, map step, items): rounds of one sync


async def sync_families(driver: Driver, keys: Sequence[str], now: datetime) -> int:
    """Sync these parents (``Driver.sync_parents``), fan out the map steps whose source has
    succeeded (``fan_out``) and sync what that changed: the map step, and the parents of changed
    parents that are children themselves. Idempotent like a sync; returns how many parents
    changed. Both the consumer's follow-up and the reconciler (``mscheduler.services.children``)
    and the operators' actions (``Operations``) call it."""
    changed = 0
    todo = list(dict.fromkeys(keys))
    for _ in range(SYNC_ROUNDS):
        if not todo:
            break
        outcome = await driver.sync_parents(SyncParentsParams(todo, now))
        changed += outcome.changed
        after = list(outcome.cascade)
        for expansion in outcome.expand:
            await fan_out(driver, expansion, now)
            after += [expansion.key, expansion.parent]
        todo = list(dict.fromkeys(after))
    return changed


async def fan_out(driver: Driver, expansion: MapExpansion, now: datetime) -> bool:
    """Fan a map step out: one item task per element of its source's result (a list of at most
    ``max_items``), keyed ``<step key>/<index>``, inserted idempotently, then the step recorded
    as fanned out (a compare-and-set). A crash in between is repaired by the next sync, which
    inserts the same keys again (the existing ones are left as they are): no item is ever made
    twice. A result that is not a list, or too long, fails the step (set failed, the reason
    given). Returns whether the step was fanned out by this call."""
    step = await driver.get_task(expansion.key)
    if step is None or step.get("children") or not step["state"].get("blocked"):
        return False  # gone, fanned out already, or reset meanwhile
    if step["state"].get("paused") or step["state"].get("cancelled") or step["state"].get("marked"):
        return False  # paused: fanned out once resumed (the resume syncs); ended: never
    source = (await driver.read_results([expansion.source])).get(expansion.source)
    if source is None or source.status != TaskStatus.SUCCEEDED.value:
        return False  # restarted since the sync saw it succeed
    items = source.result
    problem = None
    if not isinstance(items, list):
        problem = f"it maps over the result of {expansion.source!r}, a {type(items).__name__}, not a list"
    elif len(items) > expansion.max_items:
        problem = (
            f"{expansion.source!r} returned {len(items)} items, more than max_items {expansion.max_items}"
        )
    if problem is not None:
        failed, pending = TaskStatus.FAILED.value, (TaskStatus.PENDING.value,)
        await driver.mark_task(MarkParams(expansion.key, failed, pending, now, problem, "workflow"))
        return False
    assert isinstance(items, list)
    option = step["option"]
    new = [
        NewTask(item_key(expansion.key, i), step["name"], item, option, parent=expansion.key, position=i)
        for i, item in enumerate(items)
    ]
    for start in range(0, len(new), SEND_MANY_BATCH):
        await driver.insert_tasks(InsertParams(new[start : start + SEND_MANY_BATCH], now))
    on_failure = (step.get("map") or {}).get("on_failure", "fail")
    return await driver.expand_map(ExpandMapParams(expansion.key, len(new), on_failure, now))
