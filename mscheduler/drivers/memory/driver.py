"""In-process driver with the Mongo driver's semantics: the demo's default and a tool for users' tests.

It is not a database: tasks live and die with the process. Claims use heaps, not scans, so it
stays fast at 100,000 tasks. Like the Mongo indexes, the heaps are keyed by the ``state.claimers``
tokens (``name|worker`` or ``name|*``): per token a heap of future claim times and a ready heap
ordered like the Mongo claim sort, so a claim never looks at tasks aimed at other workers; and a
heap of lease expiries for ``expire_leases``. Heap entries are invalidated lazily by a version
number per write (from one counter: a removed key keeps none); a heap that outgrows twice the
stored tasks is rebuilt from its live entries, so none grows with the traffic. ``examined``
counts the documents claims and wake-up reads looked at (the benchmarks compare it with MongoDB's
``docsExamined``). Every operation on one task runs without an ``await`` inside, so each is
atomic on the event loop, as one MongoDB document write is; the passes over many tasks (lease and
deadline expiry, statistics) hand the loop back every ``PASS_CHUNK`` tasks, as an
``update_many`` is atomic per document only.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from mscheduler.domain.clock import Clock, SystemClock
from mscheduler.domain.events import (
    CONTROL_KINDS,
    DEFAULT_MAX_EVENTS,
    EventKind,
    expired_event,
    lost_lease_event,
    sent_detail,
    task_event,
)
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.partitions import checked_partitions
from mscheduler.domain.state import (
    LIVE,
    claimer_tokens,
    derive,
    family_inputs,
    live_attempts,
    stopped_by_pause,
    token_lane,
    token_name,
)
from mscheduler.drivers.base import (
    DEFAULT_WORKER_RETENTION,
    MAX_HISTORY,
    ChangeEvent,
    ClaimedTask,
    ClaimParams,
    ClaimStep,
    ControlParams,
    DerivedByOption,
    ExpireParams,
    FinishParams,
    InsertParams,
    LaneParams,
    PingParams,
    PingResult,
    UpdateOptionParams,
    Wakeup,
    WakeupParams,
    WorkerInfo,
    WorkerListParams,
    allowed,
    busy_statuses,
    cancelled_record,
    claim_over_parts,
    control_detail,
    due_time,
    event_for,
    expired_entry_changes,
    failure_times,
    finish_allowed,
    first_lease_end,
    lost_error,
    new_entry,
    new_task_document,
    paused_entry,
    report_fields,
    reset_record,
    settlement,
    stop_record,
    trim_entries,
)
from mscheduler.drivers.memory.children import MemoryChildren
from mscheduler.drivers.memory.copying import copy_doc
from mscheduler.drivers.memory.events import MemoryEvents
from mscheduler.drivers.memory.limits import MemoryLimits
from mscheduler.drivers.memory.listing import MemoryListing
from mscheduler.drivers.memory.maintenance import MemoryMaintenance
from mscheduler.drivers.memory.plans import MemoryPlans
from mscheduler.drivers.memory.stats import MemoryStats
from mscheduler.drivers.streams import Fanout, Subscription, wanted_by

_SCALARS = (str, int, float, bool, type(None), datetime)
PASS_CHUNK = 500  # heap entries a pass over many tasks (leases, deadlines) reads between yields
HEAP_SLACK = 4096  # entries a heap may hold beyond twice the stored tasks before it is rebuilt


def _past_deadline(doc: dict[str, Any], now: datetime) -> bool:
    deadline = doc["option"].get("deadline")
    return deadline is not None and deadline <= now


def _copy(value: Any) -> Any:
    return value if isinstance(value, _SCALARS) else copy_doc(value)


class MemoryDriver(
    MemoryMaintenance, MemoryPlans, MemoryChildren, MemoryEvents, MemoryStats, MemoryLimits, MemoryListing
):
    """Tasks and workers in dictionaries and heaps; the same rules as ``MongoDriver``.

    :param events: keep an event log (``mscheduler.services.events``): the newest ``max_events``.
    """

    in_process = True  # ``Publisher.wait`` is told of its task's every write (``follow_task``)
    # documents per ``insert_tasks`` a publisher sends: an insert runs on the event loop without
    # a pause, so a large batch is inserted a few hundred at a time, others running between
    insert_batch = 50

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        events: bool = False,
        max_events: int = DEFAULT_MAX_EVENTS,
        worker_retention: timedelta = DEFAULT_WORKER_RETENTION,
        partitions: int = 1,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.worker_retention = worker_retention
        # the store's partitions (mscheduler.domain.partitions): claims and heaps per partition,
        # as the Mongo driver claims within one partition at a time
        self.partitions = checked_partitions(partitions)
        self._tasks: dict[str, dict[str, Any]] = {}
        self._version: dict[str, int] = {}
        self._seq = itertools.count()
        # heaps per (partition, claimer token)
        self._future: dict[tuple[int, str], list[tuple[datetime, int, str, int]]] = {}
        self._ready: dict[tuple[int, str], list[tuple[int, int, datetime, int, str, int]]] = {}
        self.examined = 0
        self.compactions = 0  # heaps rebuilt without their stale entries (see _heap_bound)
        self._deadlines: list[tuple[datetime, int, str]] = []
        self._leases: list[tuple[datetime, int, str, str]] = []
        self._workers: dict[str, dict[str, Any]] = {}
        # the change stream of this store's tasks, shared by every watcher of the process
        # (drivers/streams.py): fed by the writes themselves, filtered by each subscriber
        self._changes: Fanout[ChangeEvent] | None = None
        # in-process waits for a task's end (Publisher.wait): (key, event) set by every write of
        # that task or of one of its children — the stream announces only writes that wake a
        # worker, not the finish a waiter waits for
        self._followers: list[tuple[str, asyncio.Event]] = []
        self._init_plans()
        self._init_events(events, max_events)
        self._init_children()
        self._init_maintenance()
        self._init_limits()
        self._init_listing()

    # -- indexing -----------------------------------------------------------------------------

    def _write(self, doc: dict[str, Any], now: datetime, wake: bool = False) -> None:
        """Recompute derived state, re-index, and announce a changed task when the write woke
        someone: as the Mongo driver's ``wake`` counter and its stream's filter (``watch_pipeline``)
        — its claimers changed to a non-empty list (claimable by someone new: a retry, a release,
        an edit), or ``wake`` (a cancel or stopping pause asks running attempts to stop). Claims,
        pings and finishes that end a task announce nothing, on either driver."""
        state = doc["state"]
        before = state.get("claimers")
        state.update(
            derive(
                doc["name"],
                doc["option"],
                state["worker_states"],
                state.get("broken") is not None,
                state.get("expired_at") is not None,
                state.get("cancelled") is not None,
                state.get("paused") is True,
                # child tasks only (most documents are neither parents nor children)
                **(
                    family_inputs(state)
                    if ("children" in state or "blocked" in state or "marked" in state)
                    else {}
                ),
            )
        )
        claimers = state["claimers"]
        self._index(doc, now, wake or (bool(claimers) and claimers != (before or [])))

    def _index(self, doc: dict[str, Any], now: datetime, wake: bool) -> None:
        """After ``derive``: set the update time and lifecycle fields, re-index and announce
        (``wake``: see ``_write``)."""
        state = doc["state"]
        state["update_time"] = now
        previous_finish = state.get("finish_time")
        self._note_lifecycle(doc, now)
        self._relist(doc, previous_finish)
        if "parent" in doc:
            self._count_child(doc)
        key = doc["key"]
        # versions come from one counter, so a key removed and sent again never meets the heap
        # entries of its earlier document (a removed key keeps no version)
        version = self._version[key] = next(self._seq)
        if "children" in doc:
            self._index_parent(doc)
        if state["claim_at"] is not None:
            item = (state["claim_at"], version, key, version)
            part = doc.get("part", 0)
            bound = self._heap_bound()
            for token in state["claimers"]:
                future = self._future.get((part, token))
                if future is None:
                    future = self._future[(part, token)] = []
                elif len(future) > bound:
                    self._compact_claim_heaps(self._future, 2)
                    future = self._future.setdefault((part, token), [])
                heapq.heappush(future, item)
            deadline = doc["option"].get("deadline")
            if deadline is not None:
                if len(self._deadlines) > bound:
                    self._deadlines = self._live_deadlines()
                heapq.heappush(self._deadlines, (deadline, next(self._seq), key))
        if wake and self._changes is not None and self._changes.subscribers:
            self._changes.feed(event_for(doc))
        if self._followers:
            for followed, changed in self._followers:
                if key == followed or key.startswith(followed + "/"):
                    changed.set()

    # -- bounds: heaps hold stale entries (a task's earlier versions, removed tasks) until they
    # come to the top; a heap that grows past twice the stored tasks is rebuilt from its live
    # entries, so each holds at most 2 x tasks + HEAP_SLACK entries whatever the traffic

    def _heap_bound(self) -> int:
        return 2 * len(self._tasks) + HEAP_SLACK

    def _compact_claim_heaps(self, heaps: dict[tuple[int, str], Any], at: int) -> None:
        """Drop the stale entries of each of ``heaps`` (the key at ``at``, its version next), and
        the heaps left empty (tokens of workers, groups and names no task names any more)."""
        version = self._version
        for token in list(heaps):
            live = [item for item in heaps[token] if version.get(item[at]) == item[at + 1]]
            if live:
                heapq.heapify(live)
                heaps[token] = live
            else:
                del heaps[token]
        self.compactions += 1

    def _live_deadlines(self) -> list[tuple[datetime, int, str]]:
        """The deadline heap without stale entries (one per pending task with that deadline)."""
        live: dict[str, tuple[datetime, int, str]] = {}
        for item in self._deadlines:
            doc = self._tasks.get(item[2])
            if (
                doc is not None
                and doc["state"]["status"] == "pending"
                and doc["option"].get("deadline") == item[0]
            ):
                live[item[2]] = item
        heap = list(live.values())
        heapq.heapify(heap)
        self.compactions += 1
        return heap

    def _push_lease(self, expire: datetime, key: str, attempt: str) -> None:
        """Queue a lease's expiry for ``expire_leases`` (each ping queues the new one)."""
        if len(self._leases) > self._heap_bound():
            self._leases = self._live_leases()
        heapq.heappush(self._leases, (expire, next(self._seq), key, attempt))

    def _live_leases(self) -> list[tuple[datetime, int, str, str]]:
        """The lease heap without entries of attempts that ended or were pinged since (an
        entry at or past its attempt's expiry is kept: it is the one that ends it)."""
        live = []
        for item in self._leases:
            doc = self._tasks.get(item[2])
            if doc is None:
                continue
            for entry in doc["state"]["worker_states"]:
                if (
                    entry["attempt"] == item[3]
                    and entry["status"] == "running"
                    and entry["ping_expire_time"] <= item[0]
                ):
                    live.append(item)
                    break
        heapq.heapify(live)
        self.compactions += 1
        return live

    def structure_sizes(self) -> dict[str, int]:
        """The entries of each in-memory structure of this store, by name (docs/design.md,
        "Steady state", says what each holds and its bound): what the steady-state benchmark
        and its test watch."""
        return {
            "tasks": len(self._tasks),
            "versions": len(self._version),
            "claim_heaps": len(self._future) + len(self._ready),
            "claim_heap_entries": sum(map(len, self._future.values())) + sum(map(len, self._ready.values())),
            "lease_heap": len(self._leases),
            "deadline_heap": len(self._deadlines),
            "finished_heaps": sum(map(len, self._finished.values())),
            "listings": len(self._by_created) + len(self._by_key) + len(self._by_finished),
            "group_listings": sum(map(len, self._by_group.values())),
            "live_hashes": len(self._live_hashes),
            "open_parents": len(self._parents),
            "events": len(self._events),
            "event_streams": len(self._event_streams),
            "event_stream_backlog": sum(stream.queue.qsize() for stream in self._event_streams),
            "workers": len(self._workers),
            "followers": len(self._followers),
            "plan_heap": len(self._plan_due),
        }

    def follow_task(self, key: str) -> tuple[asyncio.Event, Callable[[], None]]:
        """Set ``changed`` (returned with a function that stops following) at every write of the
        task ``key`` or of its children (``key/...``): an in-process ``Publisher.wait``."""
        changed = asyncio.Event()
        entry = (key, changed)
        self._followers.append(entry)

        def stop() -> None:
            if entry in self._followers:
                self._followers.remove(entry)

        return changed, stop

    def _promote(self, now: datetime, tokens: Sequence[tuple[int, str]]) -> None:
        for token in tokens:
            future = self._future.get(token)
            while future and future[0][0] <= now:
                _, seq, key, version = heapq.heappop(future)
                if self._version.get(key) != version:
                    continue
                state = self._tasks[key]["state"]
                # the claim order (priority desc, aimed at workers first, order time asc: a task
                # that ages is ordered by its aged time, mscheduler.domain.state)
                entry = (
                    -state["claim_priority"],
                    -int(state["targeted"]),
                    state["order_at"],
                    seq,
                    key,
                    version,
                )
                ready = self._ready.get(token)
                if ready is None:
                    ready = self._ready[token] = []
                elif len(ready) > self._heap_bound():
                    self._compact_claim_heaps(self._ready, 4)
                    ready = self._ready.setdefault(token, [])
                heapq.heappush(ready, entry)

    def _top(self, token: tuple[int, str]) -> tuple[int, int, datetime, int, str, int] | None:
        heap = self._ready.get(token)
        while heap:
            if self._version.get(heap[0][4]) == heap[0][5]:
                return heap[0]
            heapq.heappop(heap)
        return None

    # -- operations ---------------------------------------------------------------------------

    async def setup(self) -> None:
        return None

    async def prepare(self) -> None:
        return None

    async def server_time(self) -> datetime | None:
        return self.clock.now()

    async def insert_tasks(self, params: InsertParams) -> list[bool]:
        if params.session is not None:
            raise InvalidInput("the memory driver has no sessions or transactions")
        created = []
        derived: DerivedByOption = {}
        for task in params.tasks:
            doc = self._tasks.get(task.key)
            holder = self._unique_holder(task.unique_hash, task.key)
            if doc is None and holder is not None:
                created.append(False)  # a live task has the same params: as if the key existed
            elif doc is None:
                doc = new_task_document(task, params.now, self.partitions, derived)
                self._tasks[task.key] = doc
                self._list_new(doc)
                self._index(doc, params.now, True)  # derived already by new_task_document
                created.append(True)
            elif (
                params.reset_finished
                and doc["state"]["status"] in ("succeeded", "failed")
                and not holder
                and not live_attempts(doc["state"], params.now)  # never drop a live attempt
            ):
                doc["params"] = copy_doc(task.params)
                doc["unique_hash"] = task.unique_hash
                doc["option"] = dict(task.option)
                state = doc["state"]
                # a new generation: its events come after the earlier ones, whose attempts stay
                # in the history with who reset it
                history = state.setdefault("history", [])
                history.append(reset_record(state, params.now, params.by))
                del history[:-MAX_HISTORY]  # the last MAX_HISTORY generations: a bounded document
                state["worker_states"] = []
                state.pop("checkpoint", None)  # a fresh run starts from scratch
                state.pop("progress", None)
                state.pop("broken", None)
                state.pop("marked", None)  # a status set by hand ends with the generation
                state["generation"] = state.get("generation", 0) + 1
                self._write(doc, params.now)
                created.append(True)
            else:
                created.append(False)
        if self.record_events:
            sent = [t for t, c in zip(params.tasks, created, strict=True) if c]
            events = []
            for t in sent:
                state = self._tasks[t.key]["state"]
                detail = sent_detail(params.by, state.get("generation", 0) > 0)
                events.append(
                    task_event(self.event_writer, EventKind.SENT, t.key, t.name, params.now, state, detail)
                )
            self._record(events, params.now)
        return created

    def _eligible(self, doc: dict[str, Any], params: ClaimParams) -> bool:
        """The claim filter on a fetched document (``exclude_keys`` were skipped before: on the
        index key, as MongoDB does)."""
        self.examined += 1
        state = doc["state"]
        claim_at = state["claim_at"]
        if claim_at is None or claim_at > params.now or state["free_slots"] <= 0:
            return False
        if state["status"] not in ("pending", "running"):
            return False
        if not allowed(doc["option"], params.worker_id, params.groups):
            return False
        deadline = doc["option"].get("deadline")
        if deadline is not None and deadline <= params.now:
            return False
        busy = busy_statuses(doc["option"])
        for entry in state["worker_states"]:
            if entry["worker_id"] == params.worker_id and entry["status"] in busy:
                return False
        return True

    async def claim(self, params: ClaimParams) -> list[ClaimedTask]:
        """The Mongo driver's claim rules, without a scan: per partition and lane
        (``claim_over_parts``, the rule of every driver), the best head among the claimer
        tokens' ready heaps."""
        excluded = set(params.exclude_keys)
        skipped: list[tuple[tuple[int, str], tuple[int, int, datetime, int, str, int]]] = []
        tokens_of: dict[str | None, list[str]] = {}

        async def claim_round(plan: list[ClaimStep]) -> list[ClaimedTask | BaseException | None]:
            results: list[ClaimedTask | BaseException | None] = []
            # each partition's and lane's heaps, promoted once per round: a claim in the round
            # can only make due the task it took, which this worker may not take again
            heaps_of: dict[tuple[int, str | None], list[tuple[int, str]]] = {}
            for attempt, part, lane in plan:  # no await inside: atomic on the event loop
                heaps = heaps_of.get((part, lane))
                if heaps is None:
                    tokens = tokens_of.get(lane)
                    if tokens is None:
                        tokens = tokens_of[lane] = claimer_tokens(
                            list(params.names), params.worker_id, params.groups, (lane,)
                        )
                    heaps = heaps_of[(part, lane)] = [(part, token) for token in tokens]
                    self._promote(params.now, heaps)
                results.append(self._claim_from(params, attempt, heaps, excluded, skipped))
            return results

        claimed, _errors, _failed = await claim_over_parts(params, self.partitions, claim_round)
        for token, item in skipped:
            heapq.heappush(self._ready.setdefault(token, []), item)
        return claimed

    def _claim_from(
        self,
        params: ClaimParams,
        attempt: str,
        heaps: Sequence[tuple[int, str]],
        excluded: set[str],
        skipped: list[tuple[tuple[int, str], tuple[int, int, datetime, int, str, int]]],
    ) -> ClaimedTask | None:
        """The first eligible task among ``heaps``' heads, claimed for ``attempt`` (None: none)."""
        while True:
            best: tuple[int, int, datetime, int, str, int] | None = None
            best_token = heaps[0] if heaps else (0, "")
            for token in heaps:
                top = self._top(token)
                if top is not None and (best is None or top < best):
                    best, best_token = top, token
            if best is None:
                return None
            heapq.heappop(self._ready[best_token])
            if excluded and best[4] in excluded:  # on the index key, as MongoDB does: not examined
                skipped.append((best_token, best))
                continue
            doc = self._tasks[best[4]]
            if not self._eligible(doc, params):
                skipped.append((best_token, best))
                continue
            expire = first_lease_end(params, doc["option"])
            entry = new_entry(params, attempt, expire)
            entries = doc["state"]["worker_states"]
            entries.append(entry)
            if len(entries) > params.max_entries:
                doc["state"]["worker_states"] = trim_entries(entries, params.max_entries)
            self._write(doc, params.now)
            self._push_lease(expire, doc["key"], attempt)
            return ClaimedTask(
                key=doc["key"],
                name=doc["name"],
                params=_copy(doc["params"]),
                # the stored option itself, not a copy per attempt: a stored option is replaced
                # whole, never changed in place, and a claimed task's is read only
                option=doc["option"],
                attempt=attempt,
                attempt_no=len(doc["state"]["worker_states"]),
                ping_expire_time=expire,
                fail_cnt=doc["state"]["fail_cnt"],
                failure_times=failure_times(doc["state"]["worker_states"])
                if doc["state"]["fail_cnt"]
                else (),
                checkpoint=_copy(saved["data"]) if (saved := doc["state"].get("checkpoint")) else None,
                parent=doc.get("parent"),
                due_time=due_time(doc),
                trace=doc.get("trace"),
                needs=doc.get("needs"),
                generation=doc["state"].get("generation", 0),
                lane=doc["option"].get("fair_key"),
                claim_priority=doc["state"]["claim_priority"],
            )

    def _running_entry(
        self, doc: dict[str, Any] | None, worker_id: str, attempt: str
    ) -> dict[str, Any] | None:
        if doc is None:
            return None
        for entry in doc["state"]["worker_states"]:
            if entry["attempt"] == attempt and entry["worker_id"] == worker_id:
                return entry if entry["status"] == "running" else None
        return None

    async def ping(self, params: PingParams) -> PingResult:
        result = PingResult()
        for expire, attempts in params.groups.items():
            for key, attempt in attempts.items():
                doc = self._tasks.get(key)
                entry = self._running_entry(doc, params.worker_id, attempt)
                if doc is None or entry is None or entry["ping_expire_time"] <= params.now:
                    if paused_entry(doc, params.worker_id, attempt):
                        result.paused.append(key)
                    else:
                        result.lost.append(key)
                elif doc["state"].get("cancelled") is not None:
                    result.cancelled.append(key)
                elif stopped_by_pause(doc["state"], attempt):
                    result.paused.append(key)  # not renewed: its worker settles it released
                elif not allowed(doc["option"], params.worker_id, params.worker_groups):
                    result.revoked.append(key)
                else:
                    entry["ping_expire_time"] = expire
                    self._push_lease(expire, key, attempt)
                    result.alive[key] = doc["option"]  # as the claim's: replaced whole, read only
                    report = params.reports.get(key)
                    if report is not None:
                        # not announced (as a Mongo change stream does not pass it): the
                        # derived state does not change
                        doc["state"].update(report_fields(report, params.worker_id, attempt, params.now))
                        result.recorded.append(key)
        return result

    async def finish(self, params: Sequence[FinishParams]) -> list[bool]:
        accepted = []
        for item in params:
            doc = self._tasks.get(item.key)
            entry = self._running_entry(doc, item.worker_id, item.attempt)
            if doc is None or entry is None or entry["ping_expire_time"] <= item.now:
                accepted.append(self._already_finished(doc, item))
                continue
            if not finish_allowed(doc["state"], item.attempt, item.outcome):
                # fenced out by a cancel (or a stopping pause): the store decided. The handler
                # has stopped, so the attempt is settled as the stop said (not left running).
                settled = settlement(doc["state"], item.attempt)
                if settled is not None:
                    entry.update(status=settled[0], end_time=item.now, error=settled[1], retry_at=None)
                    self._write(doc, item.now)
                accepted.append(False)
                continue
            entry.update(
                status=item.outcome,
                end_time=item.now,
                result=_copy(item.result),
                error=_copy(item.error),
                retry_at=item.retry_at,
                final=item.final,
            )
            self._write(doc, item.now)
            accepted.append(True)
        return accepted

    @staticmethod
    def _already_finished(doc: dict[str, Any] | None, item: FinishParams) -> bool:
        """A retried finish whose first try was applied (reply lost) is accepted, as in Mongo."""
        for entry in doc["state"]["worker_states"] if doc is not None else ():
            if entry["attempt"] == item.attempt and entry["worker_id"] == item.worker_id:
                return bool(entry["status"] == item.outcome and entry["end_time"] == item.now)
        return False

    async def expire_leases(self, params: ExpireParams) -> int:
        now = params.now
        expired = 0
        popped = 0
        while self._leases and self._leases[0][0] <= now:
            popped += 1
            if not popped % PASS_CHUNK:
                await asyncio.sleep(0)  # a task's update is atomic, the pass is not (as update_many)
                continue
            _, _, key, _attempt = heapq.heappop(self._leases)
            doc = self._tasks.get(key)
            if doc is None:
                continue
            changed = False
            fail_cnt = doc["state"]["fail_cnt"]
            for position, entry in enumerate(doc["state"]["worker_states"]):
                if entry["status"] == "running" and entry["ping_expire_time"] <= now:
                    changes = expired_entry_changes(doc, entry, now, fail_cnt)
                    if self.record_events and changes["status"] == "lost":  # a stop is no loss
                        generation = doc["state"].get("generation", 0)
                        lost = lost_lease_event(
                            self.event_writer,
                            key,
                            doc["name"],
                            entry,
                            position + 1,
                            now,
                            "lease pass",
                            generation,
                            len(doc["state"]["worker_states"]),
                        )
                        self._record([lost], now)
                    entry.update(changes)
                    changed = True
            # entries of earlier generations (``state.history``; stores of earlier builds could
            # move running entries there): never left running for ever
            for generation in doc["state"].get("history") or ():
                for entry in generation["worker_states"]:
                    if entry["status"] == "running" and entry["ping_expire_time"] <= now:
                        entry.update(status="lost", end_time=now, error=lost_error())
                        changed = True
            if changed:
                expired += 1  # tasks changed, as MongoDB's update_many counts them
                self._write(doc, now)
        return expired

    async def expire_deadlines(self, params: ExpireParams) -> int:
        now = params.now
        expired = 0
        popped = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            popped += 1
            if not popped % PASS_CHUNK:
                await asyncio.sleep(0)  # a task's update is atomic, the pass is not (as update_many)
                continue
            _, _, key = heapq.heappop(self._deadlines)
            doc = self._tasks.get(key)
            if doc is None or doc["state"]["status"] != "pending":
                continue
            deadline = doc["option"].get("deadline")
            if deadline is None or deadline > now:
                continue  # changed since (a later deadline has its own heap entry)
            doc["state"]["expired_at"] = now
            self._write(doc, now)
            expired += 1
            if self.record_events:
                self._record(
                    [expired_event(self.event_writer, key, doc["name"], deadline, now, doc["state"])], now
                )
        return expired

    async def find_lanes(self, params: LaneParams) -> list[str]:
        """The fairness keys of the names' tokens with a live heap entry: one look at each
        token's heaps (stale heads dropped), not at the tasks."""
        names = set(params.names)
        lanes: set[str] = set()
        for heaps in (self._ready, self._future):
            for part_token in list(heaps):
                token = part_token[1]
                lane = token_lane(token)
                if lane is None or lane in lanes or token_name(token) not in names:
                    continue
                if params.after is not None and lane <= params.after:
                    continue
                if self._live_head(heaps, part_token):
                    lanes.add(lane)
        return sorted(lanes)[: params.limit]

    def _live_head(self, heaps: dict[tuple[int, str], list[Any]], token: tuple[int, str]) -> bool:
        """Whether the heap of ``token`` holds a live entry (stale heads are dropped; an empty
        heap is forgotten: a lane's tokens do not outlive its tasks)."""
        heap = heaps[token]
        while heap:
            key, version = heap[0][-2], heap[0][-1]
            if self._version.get(key) == version:
                return True
            heapq.heappop(heap)
        del heaps[token]
        return False

    async def find_wakeups(self, params: WakeupParams) -> list[Wakeup]:
        names = claimer_tokens(list(params.names), params.worker_id, params.groups, params.lanes)
        tokens = [(part, token) for part in range(self.partitions) for token in names]
        self._promote(params.now, tokens)
        found: dict[str, datetime] = {}
        for token in tokens:
            for _, _, _, _, key, version in self._ready.get(token, ()):
                if len(found) >= params.limit:
                    break
                if self._version.get(key) == version:
                    self.examined += 1
                    found[key] = self._tasks[key]["state"]["claim_at"]
        # the earliest of every heap (partition and token), merged: the Mongo read's order
        later: dict[str, datetime] = {}
        room = params.limit - len(found)
        for token in tokens:
            for claim_at, key in self._earliest(self._future.get(token, []), room):
                if key not in found and (key not in later or claim_at < later[key]):
                    later[key] = claim_at
        for key, claim_at in sorted(later.items(), key=lambda kv: kv[1])[: max(room, 0)]:
            found[key] = claim_at
        # a task past its deadline is never claimed (the claim's rule): no claim wake-up for it
        wakeups = [
            Wakeup(key, when, "claim", self._tasks[key]["option"].get("fair_key"))
            for key, when in found.items()
            if not _past_deadline(self._tasks[key], params.now)
        ]
        if self._leases:
            wakeups.append(Wakeup(self._leases[0][2], self._leases[0][0], "lease"))
        wakeups += [Wakeup(key, when, "deadline") for when, key in self._earliest_deadlines(params.limit)]
        return wakeups

    def _earliest_deadlines(self, limit: int) -> list[tuple[datetime, str]]:
        """The ``limit`` earliest deadlines of pending tasks (a best-first walk of the heap, as
        ``_earliest``; entries of tasks that moved on are skipped)."""
        heap = self._deadlines
        out: list[tuple[datetime, str]] = []
        seen: set[str] = set()
        frontier = [(heap[0], 0)] if heap and limit > 0 else []
        while frontier and len(out) < limit:
            (deadline, _, key), i = heapq.heappop(frontier)
            doc = self._tasks.get(key)
            if (
                doc is not None
                and key not in seen
                and doc["state"]["status"] == "pending"
                and doc["option"].get("deadline") == deadline
            ):
                seen.add(key)
                out.append((deadline, key))
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return out

    def _earliest(self, heap: list[tuple[datetime, int, str, int]], limit: int) -> list[tuple[datetime, str]]:
        """The ``limit`` earliest live entries of a heap, in O(limit log limit): a best-first walk
        of the heap's tree instead of a scan (stale entries are skipped, not counted)."""
        out: list[tuple[datetime, str]] = []
        frontier = [(heap[0], 0)] if heap and limit > 0 else []
        while frontier and len(out) < limit:
            (claim_at, _, key, version), i = heapq.heappop(frontier)
            if self._version.get(key) == version:
                self.examined += 1
                out.append((claim_at, key))
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return out

    def watch(self, names: Sequence[str], resume_token: Any = None) -> Subscription[ChangeEvent]:
        """The tasks with these names as they change (every write, whole documents), from now: a
        subscription to this store's one stream (``drivers/streams.py``)."""
        loop = asyncio.get_running_loop()
        if self._changes is None or self._changes.loop is not loop:
            self._changes = Fanout(("tasks", id(self)))
        return self._changes.subscribe(wanted_by(names))

    async def get_task(self, key: str) -> dict[str, Any] | None:
        doc = self._tasks.get(key)
        return copy_doc(doc) if doc is not None else None

    async def count_by_status(self) -> dict[str, int]:
        return dict(Counter(doc["state"]["status"] for doc in self._tasks.values()))

    async def update_option(self, params: UpdateOptionParams) -> bool:
        doc = self._tasks.get(params.key)
        if doc is None:
            return False
        if doc.get("unique_hash") is not None and doc["state"]["status"] not in LIVE:
            # an edit may make a finished task live again (a larger retry budget): refused while
            # another live task holds its params hash, as MongoDB's unique index refuses it
            state = doc["state"]
            after = derive(
                doc["name"],
                dict(params.option),
                state["worker_states"],
                state.get("broken") is not None,
                state.get("expired_at") is not None,
                state.get("cancelled") is not None,
                state.get("paused") is True,
                **family_inputs(state),
            )
            if after["status"] in LIVE:
                self._check_unique(doc)
        doc["option"] = dict(params.option)
        self._write(doc, params.now)
        if self.record_events:
            detail = {"by": params.by} if params.by else None
            edited = task_event(
                self.event_writer, EventKind.EDITED, params.key, doc["name"], params.now, doc["state"], detail
            )
            self._record([edited], params.now)
        return True

    async def control_task(self, params: ControlParams) -> dict[str, Any] | None:
        doc = self._tasks.get(params.key)
        if doc is None or doc["state"]["status"] not in params.statuses:
            return None
        state = doc["state"]
        if params.action == "remove":
            self._record_control(doc, params)
            self._forget(doc)
            del self._tasks[params.key]
            del self._version[params.key]  # its heap entries are stale now
            return doc
        if params.action == "cancel":
            state["cancelled"] = cancelled_record(params)
            state["stop"] = stop_record("cancel", state["worker_states"], params.now)
        elif params.action == "pause" and params.stop_running:
            # the running attempts keep their entries (and slots) until their workers settle
            # them released once the handlers stopped, or the lease pass at their lease's end
            state["paused"] = True
            state["stop"] = stop_record("pause", state["worker_states"], params.now)
        elif params.action in ("pause", "resume"):
            state["paused"] = params.action == "pause"
            if params.action == "resume":
                state["stop"] = None
        elif params.action == "restart":
            if live_attempts(state, params.now):
                return None  # an attempt still runs: refused (Operations names it)
            self._check_unique(doc)  # its params are held by another live task: refused
            fail_cnt = state["fail_cnt"]
            for entry in state["worker_states"]:  # holders gone: settled as the lease pass would
                if entry["status"] == "running":
                    entry.update(expired_entry_changes(doc, entry, params.now, fail_cnt))
            generation = state.get("generation", 0)
            history = state.setdefault("history", [])
            history.append(
                {
                    "generation": generation,
                    "restart_time": params.now,
                    "worker_states": state["worker_states"],
                }
            )
            del history[:-MAX_HISTORY]  # the last MAX_HISTORY generations: a bounded document
            state.update(
                generation=generation + 1,
                worker_states=[],
                cancelled=None,
                expired_at=None,
                broken=None,
                marked=None,  # a status set by hand (child tasks) ends with the generation
                paused=False,
                stop=None,
                checkpoint=None,  # a fresh generation starts from scratch
                progress=None,
            )
            deadline = doc["option"].get("deadline")
            if params.deadline is not None:  # the operator's; else a past one is dropped
                doc["option"] = doc["option"] | {"deadline": params.deadline}
            elif deadline is not None and deadline <= params.now:
                doc["option"] = doc["option"] | {"deadline": None}
        else:
            raise InvalidInput(f"unknown control action {params.action!r}")
        # a cancel or a stopping pause that asks running attempts to stop wakes their workers
        stopping = params.action == "cancel" or (params.action == "pause" and params.stop_running)
        self._write(doc, params.now, wake=stopping and state.get("stop") is not None)
        self._record_control(doc, params)
        return copy_doc(doc)

    def _record_control(self, doc: dict[str, Any], params: ControlParams) -> None:
        """The control's event, where the task's state (as the change left it) puts it."""
        kind = CONTROL_KINDS.get(params.action)
        if kind is not None and self.record_events:
            detail = control_detail(params)
            event = task_event(
                self.event_writer, kind, params.key, doc["name"], params.now, doc["state"], detail
            )
            self._record([event], params.now)

    def _drop_gone_workers(self, now: datetime) -> None:
        """Registrations silent for ``worker_retention`` go (the Mongo driver's TTL index)."""
        gone = now - self.worker_retention
        for worker_id in [w for w, doc in self._workers.items() if doc["last_seen"] < gone]:
            del self._workers[worker_id]

    async def register_worker(self, info: WorkerInfo) -> bool:
        self._drop_gone_workers(info.start_time)  # each start adds an id: the dead ones go
        old = self._workers.get(info.worker_id)
        live = old is not None and old["stop_time"] is None
        self._workers[info.worker_id] = {
            "worker_id": info.worker_id,
            "host": info.host,
            "pid": info.pid,
            "names": list(info.names),
            "groups": list(info.groups),
            "concurrency": info.concurrency,
            "schemas": [{"name": name, "schema": text} for name, text in info.schemas],
            "start_time": old["start_time"] if old is not None and live else info.start_time,
            "last_seen": info.start_time,
            "running_cnt": old["running_cnt"] if old is not None and live else 0,
            "stop_requested": bool(old is not None and live and old["stop_requested"]),
            "stop_time": None,
        }
        return bool(self._workers[info.worker_id]["stop_requested"])

    async def heartbeat_worker(self, worker_id: str, now: datetime, running_cnt: int) -> bool:
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        worker.update(last_seen=now, running_cnt=running_cnt)
        return bool(worker["stop_requested"])

    async def request_worker_stop(self, worker_id: str, now: datetime) -> bool:
        worker = self._workers.get(worker_id)
        if worker is None or worker["stop_time"] is not None:
            return False
        worker["stop_requested"] = True
        return True

    async def unregister_worker(self, worker_id: str, now: datetime) -> None:
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.update(stop_time=now, last_seen=now, running_cnt=0)

    async def list_workers(self, params: WorkerListParams | None = None) -> list[dict[str, Any]]:
        params = params or WorkerListParams()
        if params.now is not None:  # expired registrations go (the Mongo driver's TTL index)
            self._drop_gone_workers(params.now)
        workers = list(self._workers.values())
        if params.live_since is not None:
            since = params.live_since
            workers = [w for w in workers if w["stop_time"] is None and w["last_seen"] >= since]
        else:
            workers.sort(key=lambda w: (w["start_time"], w["worker_id"]))
            if params.after is not None:
                workers = [w for w in workers if (w["start_time"], w["worker_id"]) > params.after]
        shown = [dict(w) for w in workers[: params.limit]]
        for worker in shown:
            schemas = worker.pop("schemas", [])
            if params.schemas:
                worker["schemas"] = [dict(s) for s in schemas]
        return shown
