"""The fairness rotation: deficit round-robin over lanes within the top known claim priority."""

from __future__ import annotations

from mscheduler.domain.fairness import Fairness, FairRotation


def rotation(*lanes: str, **weights: int) -> FairRotation:
    r = FairRotation(Fairness(weights=weights))
    r.refresh(lanes)
    r.exhausted([None])  # no task without a key
    return r


def test_each_lane_takes_one_turn_in_order_and_the_rotation_moves_on() -> None:
    r = rotation("a", "b", "c")
    assert r.turns(2) == ["a", "b", "c"]  # two turns, then c as the spare
    r.claimed([("a", 0), ("b", 0)])
    assert r.turns(2) == ["c", "a", "b"]


def test_a_lane_of_weight_three_takes_three_turns_in_a_row() -> None:
    r = rotation("a", "b", a=3)
    taken = []
    for _ in range(8):
        turn = r.turns(1)
        taken.append(turn[0])
        r.claimed([(turn[0], 0)])
    assert taken == ["a", "a", "a", "b", "a", "a", "a", "b"]


def test_a_spare_lane_that_took_an_attempt_has_had_its_turn() -> None:
    r = rotation("a", "b", "c")
    assert r.turns(1) == ["a", "b"]
    r.exhausted(["a"])
    r.claimed([("b", 0)])  # a was empty: b took its attempt
    assert r.turns(1) == ["c", "b"]


def test_lanes_of_a_lower_known_priority_wait_for_the_top_ones() -> None:
    r = rotation("a", "b", "c")
    r.claimed([("a", 5), ("b", 1), ("c", 5)])
    assert r.turns(4) == ["a", "c", "a", "c"]
    r.seen("b", 9)  # an event: b has a task of priority 9 (above what was known of it)
    assert r.turns(1) == ["b"]


def test_a_lane_whose_head_is_unknown_is_visited_to_learn_it() -> None:
    r = rotation("a", "b")
    r.claimed([("a", 5), ("b", 5)])
    r.seen("new")
    assert "new" in r.turns(3)


def test_emptied_lanes_leave_and_with_none_left_the_claims_go_to_lane_none() -> None:
    r = rotation("a")
    r.exhausted(["a"])
    assert r.turns(3) == [None]
    r.refresh(["b"])
    assert set(r.lanes) == {None, "b"}


def test_the_rotation_is_bounded() -> None:
    r = FairRotation(Fairness(max_lanes=3))
    r.refresh(["a", "b", "c", "d"])
    assert r.lanes == [None, "a", "b"]
    r.seen("e")
    assert len(r) == 3
