"""How a change event moves a consumer's wake-up queue (``Discovery.on_change``), event by event."""

from __future__ import annotations

from datetime import timedelta

from mscheduler.drivers.base import ChangeEvent
from mscheduler.drivers.memory.driver import MemoryDriver
from mscheduler.runtime.consumer.discovery import CLAIM, Discovery
from mscheduler.testing.clock import FakeClock


def discovery(worker: str, groups: tuple[str, ...] = ()) -> Discovery:
    clock = FakeClock()
    return Discovery(
        MemoryDriver(clock),
        clock,
        worker_id=worker,
        names=["job"],
        poll_interval=1.0,
        stream_poll_interval=30.0,
        batch_size=10,
        max_size=100,
        on_event=lambda kind, fields: None,
        groups=groups,
    )


def event(d: Discovery, **fields: object) -> ChangeEvent:
    base: dict[str, object] = dict(
        key="t", name="job", claim_at=None, lease_expiry=None, specific_worker_ids=()
    )
    return ChangeEvent(**(base | fields))  # type: ignore[arg-type]


def test_claimers_decide_who_keeps_a_wake_up() -> None:
    mine, other = discovery("w1"), discovery("w2")
    for d in (mine, other):
        d.queue.push("t", d.clock.now(), CLAIM)
        d.on_change(event(d, claimers=("job|w1",)))
    assert len(mine.queue) == 1 and len(other.queue) == 0
    partial = discovery("w2")
    partial.queue.push("t", partial.clock.now(), CLAIM)
    partial.on_change(event(partial, claimers=("job|w1",), claimers_complete=False))
    assert len(partial.queue) == 1, "only changed elements listed: others may claim too"


def test_an_event_without_claimers_keeps_a_group_members_wake_up() -> None:
    """Without the claimers list an event names only the task's worker ids; a member of a group
    may be allowed by the task's groups, which the event does not carry: it keeps its wake-up,
    a worker of no group named nowhere drops it."""
    member, outsider = discovery("w9", groups=("gpu",)), discovery("w8")
    for d in (member, outsider):
        d.on_change(event(d, specific_worker_ids=("w1",), claim_at=d.clock.now() + timedelta(seconds=5)))
    assert member.queue.next_time() == member.clock.now() + timedelta(seconds=5)
    assert len(outsider.queue) == 0
