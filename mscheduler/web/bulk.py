"""Bulk actions over a filter, run by the API process in the background: one ``BulkJob`` per
request, a page of tasks at a time through ``Operations.control_matching``, its progress and
its outcomes kept here for ``GET /api/v1/bulk/{id}``.

The jobs live in the memory of the API process that started them (``app.state.bulk``): behind a
load balancer, ask the server that answered the POST (its ``Location``); a restarted server has
forgotten them (the changes made stay made). At most ``RUNNING_MAX`` run at once; the newest
``KEPT_MAX`` are kept; each keeps the first ``RESULTS_MAX`` outcomes (the counts go on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mscheduler.domain.exceptions import MSchedulerError
from mscheduler.operations import BulkOutcome, Operations, TaskCount

RUNNING_MAX = 4
KEPT_MAX = 50
RESULTS_MAX = 10_000

log = logging.getLogger("mscheduler.web.bulk")


@dataclass
class BulkJob:
    """One bulk action over a filter: what it is, how far it got, what it did to each task."""

    id: str
    action: str
    filters: dict[str, Any]
    by: str
    started: datetime
    matched: TaskCount
    state: str = "running"  # running, done, stopped, failed
    processed: int = 0
    done: int = 0
    refused: int = 0
    unknown: int = 0
    results: list[BulkOutcome] = field(default_factory=list)
    error: str | None = None
    ended: datetime | None = None
    stop_requested: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def add(self, page: list[BulkOutcome]) -> None:
        for outcome in page:
            self.processed += 1
            if outcome.outcome == "done":
                self.done += 1
            elif outcome.outcome == "refused":
                self.refused += 1
            else:
                self.unknown += 1
        room = RESULTS_MAX - len(self.results)
        self.results.extend(page[: max(room, 0)])


class BulkJobs:
    """The jobs of one app: start, look up, stop; all stopped when the app stops."""

    def __init__(self) -> None:
        self._jobs: OrderedDict[str, BulkJob] = OrderedDict()

    def running(self) -> int:
        return sum(job.state == "running" for job in self._jobs.values())

    def get(self, job_id: str) -> BulkJob | None:
        return self._jobs.get(job_id)

    def all(self) -> list[BulkJob]:
        """Newest first."""
        return list(reversed(self._jobs.values()))

    async def start(
        self,
        operations: Operations,
        action: str,
        filters: dict[str, Any],
        options: dict[str, Any],
        *,
        by: str,
    ) -> BulkJob:
        """Check the action and filters (``InvalidInput``: nothing starts), count what they
        select, and run the action in the background."""
        pages = await operations.control_matching(action, by=by, **options, **filters)
        matched = await operations.count_tasks(**filters)
        job = BulkJob(
            id=secrets.token_hex(8),
            action=action,
            filters=filters,
            by=by,
            started=operations.clock.now(),
            matched=matched,
        )
        job.task = asyncio.ensure_future(self._run(job, pages, operations))
        self._jobs[job.id] = job
        self._forget_old()
        return job

    async def _run(self, job: BulkJob, pages: Any, operations: Operations) -> None:
        try:
            async for page in pages:
                job.add(page)
                if job.stop_requested:
                    job.state = "stopped"
                    await pages.aclose()
                    break
            else:
                job.state = "done"
        except asyncio.CancelledError:
            job.state = "stopped"
            raise
        except MSchedulerError as exc:
            job.state, job.error = "failed", f"{type(exc).__name__}: {exc}"
            log.warning("bulk %s %s failed after %d tasks: %s", job.action, job.id, job.processed, exc)
        finally:
            job.ended = operations.clock.now()
            log.info(
                "bulk %s %s by %s: %s, %d done, %d refused, %d gone",
                job.action,
                job.id,
                job.by,
                job.state,
                job.done,
                job.refused,
                job.unknown,
            )

    def stop(self, job: BulkJob) -> None:
        """Ask a running job to stop after the page it is on (what was done stays done)."""
        job.stop_requested = True

    async def aclose(self, grace: float = 5.0) -> None:
        """Stop every job: after its page, or cancelled once ``grace`` seconds passed."""
        running = [job.task for job in self._jobs.values() if job.task is not None and not job.task.done()]
        for job in self._jobs.values():
            job.stop_requested = True
        if running:
            _, late = await asyncio.wait(running, timeout=grace)
            for task in late:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*late, return_exceptions=True)

    def _forget_old(self) -> None:
        while len(self._jobs) > KEPT_MAX:
            oldest = next((k for k, j in self._jobs.items() if j.state != "running"), None)
            if oldest is None:
                return
            del self._jobs[oldest]
