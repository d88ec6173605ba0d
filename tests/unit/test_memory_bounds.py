"""The memory store's in-memory structures hold what is live, not what was ever sent: its sorted
listings against a plain sorted list, heaps rebuilt once stale entries outnumber live ones, an
event stream's backlog, packed events, and the metrics' label sets."""

from __future__ import annotations

import bisect
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mscheduler import FakeClock, Operations, Publisher, Task, TaskOption
from mscheduler.domain.exceptions import StorageError
from mscheduler.drivers.base import EventQuery, InsertEventsParams
from mscheduler.drivers.memory import driver as memory_driver
from mscheduler.drivers.memory import events as memory_events
from mscheduler.drivers.memory import sortedlist
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.drivers.memory.events import pack_event, unpack_event
from mscheduler.drivers.memory.sortedlist import SortedChunks

operations = st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=200)


@settings(max_examples=200, deadline=None)
@given(operations, st.integers(-1, 41), st.booleans())
def test_sorted_chunks_keep_the_order_of_a_sorted_list(
    ops: list[tuple[bool, int]], bound: int, strict: bool
) -> None:
    chunk = sortedlist.CHUNK
    sortedlist.CHUNK = 4  # small chunks: splits and emptied chunks on every example
    try:
        chunks, reference = SortedChunks(), list[int]()
        for add, value in ops:
            if add:
                chunks.add(value)
                bisect.insort(reference, value)
            else:
                assert chunks.discard(value) == (value in reference)
                if value in reference:
                    reference.remove(value)
        assert list(chunks) == reference and len(chunks) == len(reference)
        assert (bound in chunks) == (bound in reference)
        above = [v for v in reference if (v > bound if strict else v >= bound)]
        assert list(chunks.ascending(bound, strict=strict)) == above
        assert list(chunks.descending(bound)) == [v for v in reversed(reference) if v < bound]
        assert list(chunks.descending()) == list(reversed(reference))
    finally:
        sortedlist.CHUNK = chunk


async def test_claim_heaps_do_not_keep_removed_tasks(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks due in an hour, removed before they are due, again and again: the heaps' stale
    entries would wait an hour to come to the top; they are dropped once they outnumber the
    live ones (at most 2 x tasks + HEAP_SLACK entries)."""
    monkeypatch.setattr(memory_driver, "HEAP_SLACK", 16)
    store = MemoryDriver(clock=fake_clock)
    ops = Operations(store, clock=fake_clock)
    later = TaskOption(run_at=fake_clock.now() + timedelta(hours=1))
    for round_no in range(10):
        keys = [f"r{round_no}-{i}" for i in range(50)]
        await Publisher(store, clock=fake_clock).send_many([Task(k, "job", option=later) for k in keys])
        for key in keys:
            await ops.remove(key)
        sizes = store.structure_sizes()
        assert sizes["tasks"] == 0 and sizes["versions"] == 0
        assert sizes["claim_heap_entries"] <= 2 * sizes["tasks"] + 16 + 50
    assert store.compactions > 0


async def test_a_reader_that_falls_behind_the_event_stream_is_told_to_reopen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory_events, "MAX_STREAM_BACKLOG", 5)
    store = MemoryDriver(events=True)
    stream = await store.open_event_stream(EventQuery())
    now = store.clock.now()
    events = [_event(f"e{i}", now) for i in range(20)]
    await store.insert_events(InsertEventsParams(events, now))
    assert store.structure_sizes()["event_stream_backlog"] <= 5
    with pytest.raises(StorageError, match="fell behind"):
        await anext(aiter(stream))
    await stream.aclose()


def test_a_packed_event_unpacks_to_the_same_document() -> None:
    from datetime import UTC, datetime

    doc = _event("e1", datetime(2030, 1, 1, tzinfo=UTC)) | {"detail": {"error": "x", "n": 1}, "other": [1]}
    assert unpack_event(pack_event(doc)) == doc
    assert unpack_event(pack_event({"id": "e2", "detail": {}})) == {"id": "e2", "detail": {}}
    # stored with its written time (the insert's), in place of one the document may carry
    written = datetime(2030, 1, 2, tzinfo=UTC)
    assert unpack_event(pack_event(doc, written)) == doc | {"written": written}
    assert unpack_event(pack_event(doc | {"written": None}, written)) == doc | {"written": written}


def _event(event_id: str, now: Any) -> dict[str, Any]:
    return {
        "id": event_id,
        "kind": "sent",
        "key": "k",
        "name": "job",
        "plan_id": None,
        "worker_id": None,
        "attempt": None,
        "step": 0,
        "writer": "w",
        "seq": 1,
        "time": now,
        "detail": {},
    }


def test_metrics_give_at_most_max_names_their_own_series(monkeypatch: pytest.MonkeyPatch) -> None:
    from mscheduler.observability import metrics

    monkeypatch.setattr(metrics, "MAX_NAMES", 3)
    watched = metrics.Metrics()
    for i in range(10):
        watched.on_event("sent", {"name": f"name{i}", "created": True})
        watched.on_event("claimed", {"name": f"name{i}", "queue_wait": 0.1})
    labels = {
        s.labels["name"]
        for family in watched.registry.collect()
        for s in family.samples
        if "name" in s.labels
    }
    assert labels == {"name0", "name1", "name2", metrics.OTHER_NAME}


async def test_registrations_of_workers_long_gone_leave_when_another_registers(fake_clock: FakeClock) -> None:
    """Every consumer start registers a new worker id; one silent for ``worker_retention`` goes
    at the next registration, not only when someone lists the workers."""
    from mscheduler.drivers.base import WorkerInfo

    store = MemoryDriver(clock=fake_clock)
    for i in range(5):
        await store.register_worker(WorkerInfo(f"w{i}", "host", 1, ["job"], 1, fake_clock.now()))
        await store.unregister_worker(f"w{i}", fake_clock.now())
        fake_clock.advance(store.worker_retention + timedelta(seconds=1))
    assert store.structure_sizes()["workers"] == 1
