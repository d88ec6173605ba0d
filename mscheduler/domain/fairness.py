"""Fairness between keys (tenants): which lanes a claim round visits, in which order.

A task sent with ``TaskOption(fair_key="acme")`` is in the *lane* ``acme``: its claimer tokens
carry the key (``name#acme|*``, ``mscheduler.domain.state``), so a claim of one lane's tasks is an
equality on the claim index, the same bounded read as any claim. Tasks without a key are the lane
None. A claimer (a consumer, an API server's remote executors) keeps a ``FairRotation``: the lanes
it knows to have claimable tasks, visited by deficit round-robin — each round of a claim deals its
attempts over the next lanes in turn (``ClaimParams.lanes``; the drivers' ``claim_over_parts``),
a lane of weight w taking w turns in a row — so a key with 100,000 due tasks and a key with 10
both progress, one claim each per turn.

Priority still comes first: a lane is visited in the rotation of the highest claim priority the
claimer knows among its lanes' heads (learnt from the tasks claimed from it and from the change
events of new tasks); a lane whose head is not known yet (new, or re-read at a poll) is visited to
learn it. So among due tasks of one priority, claims rotate across keys; a task of a higher
priority waits at most one round of the lanes whose heads are not known.

Where lanes come from: the store's list of keys with claimable tasks (``Driver.find_lanes``, at
each poll of a consumer; for remote executors at most once a poll interval, before a claim), the
change events of new and re-claimable tasks, and the wake-ups that fall due. A claim round also
lists a few lanes that take no turn (``turns``): an attempt whose lane has emptied goes to them,
so a stale lane never leaves a claim with nothing while others have work. A lane where a claim
found nothing leaves the rotation until it is found again. The lane None is
put back at every poll (the store does not list it); a claimer whose rotation is empty claims
from it. The rotation is bounded (``max_lanes``): a
claimer that knows more keys visits the ones it learnt first, and forgets the rest until a poll
lists them again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import validate_fair_key
from mscheduler.domain.stats import checked_input

KEY_WAITS_MAX = 1000

DEFAULT_MAX_LANES = 10_000
MAX_WEIGHT = 1000


class Fairness(BaseModel):
    """How a claimer shares its claims between fairness keys: ``weights`` per key (a key of
    weight 3 takes three claims per round to the others' one; 1 by default), and at most
    ``max_lanes`` keys in its rotation at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights: Mapping[str, StrictInt] = Field(default_factory=dict)
    max_lanes: int = Field(DEFAULT_MAX_LANES, ge=1, le=1_000_000)

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: Mapping[str, int]) -> Mapping[str, int]:
        for key, weight in value.items():
            validate_fair_key(key)
            if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
                raise ValueError(f"weight of {key!r} must be an integer from 1 to {MAX_WEIGHT}")
        return dict(value)


@dataclass(slots=True)
class _Lane:
    priority: int | None = None  # the claim priority of its head, as last learnt (None: unknown)


@dataclass(slots=True)
class FairRotation:
    """The lanes a claimer visits, by deficit round-robin within the top claim priority."""

    fairness: Fairness = field(default_factory=Fairness)
    _lanes: OrderedDict[str | None, _Lane] = field(default_factory=OrderedDict)
    _turns_left: int = 0  # turns the lane at the head of the rotation still has in this round
    # when a claimer last read the lanes from the store (its monotonic clock; None: never)
    read_at: float | None = None
    _spare: set[str | None] = field(default_factory=set)  # the last ``turns``' lanes without a turn

    def __post_init__(self) -> None:
        self._lanes[None] = _Lane()

    def __len__(self) -> int:
        return len(self._lanes)

    @property
    def lanes(self) -> list[str | None]:
        """The lanes in the rotation, in their visiting order."""
        return list(self._lanes)

    def weight(self, lane: str | None) -> int:
        return self.fairness.weights.get(lane, 1) if lane is not None else 1

    def seen(self, lane: str | None, priority: int | None = None) -> None:
        """``lane`` has a claimable task (of claim priority ``priority``, when known): in the
        rotation (at its end when new), its head's priority raised to it."""
        known = self._lanes.get(lane)
        if known is None:
            if len(self._lanes) >= self.fairness.max_lanes:
                return  # bounded: a later poll lists it again
            self._lanes[lane] = _Lane(priority)
        elif priority is not None and known.priority is not None and priority > known.priority:
            known.priority = priority

    def refresh(self, lanes: Iterable[str | None]) -> None:
        """A poll's list of the lanes with claimable tasks (the lane None is always in it): lanes
        not listed leave, the listed ones are visited again to learn their heads."""
        listed = dict.fromkeys([None, *lanes])
        for lane in [lane for lane in self._lanes if lane not in listed]:
            del self._lanes[lane]
        for state in self._lanes.values():
            state.priority = None
        for lane in listed:
            self.seen(lane)

    def _top(self) -> list[str | None]:
        """The lanes of the highest claim priority known (lanes whose head is not known too)."""
        known = [s.priority for s in self._lanes.values() if s.priority is not None]
        top = max(known, default=None)
        return [lane for lane, s in self._lanes.items() if s.priority is None or s.priority == top]

    def turns(self, n: int) -> list[str | None]:
        """The lanes of the next ``n`` claims, in order (a lane of weight w: w in a row), and the
        rotation moved on past them; then up to ``n`` more lanes of the top priority, next in
        the rotation, that take no turn: where an attempt goes when its lane is found empty
        (``claim_over_parts``), so that a lane the rotation still lists but that has emptied
        does not leave a claim with nothing. One lane alone is listed once."""
        top = self._top()
        if len(top) <= 1:
            return top or [None]
        out = self._turns(n, top)
        spare = [lane for lane in self._lanes if lane in top and lane not in out][:n]
        self._spare = set(spare)
        return out + spare

    def _turns(self, n: int, top: list[str | None]) -> list[str | None]:
        out: list[str | None] = []
        while len(out) < n:
            head = next(iter(self._lanes))
            if head not in top:
                self._lanes.move_to_end(head)
                self._turns_left = 0
                continue
            if self._turns_left <= 0:
                self._turns_left = self.weight(head)
            out.append(head)
            self._turns_left -= 1
            if self._turns_left <= 0:
                self._lanes.move_to_end(head)
        return out

    def claimed(self, lanes_priorities: Iterable[tuple[str | None, int]]) -> None:
        """Tasks were claimed from these lanes, with these claim priorities: each lane's head is
        now at most the lowest of them (its best tasks are taken)."""
        if len(self._lanes) <= 1 and not self._spare:
            return  # one lane: every claim goes to it, whatever its head's priority
        lowest: dict[str | None, int] = {}
        for lane, priority in lanes_priorities:
            lowest[lane] = min(priority, lowest.get(lane, priority))
        for lane, priority in lowest.items():
            state = self._lanes.get(lane)
            if state is not None:
                state.priority = priority
                if lane in self._spare:  # it took an emptied lane's attempt: that was its turn
                    if next(iter(self._lanes)) == lane:
                        self._turns_left = 0
                    self._lanes.move_to_end(lane)
        self._spare.clear()

    def exhausted(self, lanes: Sequence[str | None]) -> None:
        """A claim found nothing in these lanes: they leave the rotation until found again (by a
        poll, a change event, a wake-up). With no lane left, claims go to the lane None."""
        for lane in lanes:
            self._lanes.pop(lane, None)


class KeyWait(BaseModel):
    """A fairness key's due tasks: how many are claimable now (``due``) and how long the one due
    first has waited (``oldest_wait``, seconds since it became due)."""

    model_config = ConfigDict(frozen=True)

    key: str
    due: int
    oldest_wait: float


def checked_key_waits_input(names: Iterable[str] | None, limit: object) -> tuple[tuple[str, ...] | None, int]:
    """Validated ``Operations.key_waits`` arguments (``InvalidInput`` names the field)."""
    _, checked_names, _ = checked_input(None, names, None)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= KEY_WAITS_MAX:
        raise InvalidInput(f"limit: an integer from 1 to {KEY_WAITS_MAX:,}")
    return checked_names, limit
