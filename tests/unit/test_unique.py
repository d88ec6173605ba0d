"""The params hash of ``unique_by="params"`` (SPEC F16): canonical, so dict order does not
matter; different names or params give different hashes."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mscheduler import Task
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.unique import params_hash

keys = st.text(min_size=1, max_size=8).filter(
    lambda k: not k.startswith("$") and "." not in k and "\x00" not in k
)
scalars = st.none() | st.booleans() | st.integers(-(2**63) + 1, 2**63 - 1) | st.text(max_size=10)
params = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


def shuffled(value: Any, rng: random.Random) -> Any:
    """``value`` with every dict's keys in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


@given(params, st.integers(0, 2**32))
def test_dict_order_does_not_matter(value: Any, seed: int) -> None:
    assert params_hash("job", shuffled(value, random.Random(seed))) == params_hash("job", value)


@given(params, params)
def test_different_params_give_different_hashes(a: Any, b: Any) -> None:
    # different as stored: another value, or another JSON type of an equal-looking one (1, True)
    assume(json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True))
    assert params_hash("job", a) != params_hash("job", b)


def test_the_name_is_part_of_the_hash() -> None:
    assert params_hash("a", {"x": 1}) != params_hash("b", {"x": 1})


def test_types_are_kept_apart() -> None:
    assert len({params_hash("j", v) for v in (1, 1.0, True, "1", [1], None)}) == 6


def test_datetimes_hash_by_instant_at_millisecond_precision() -> None:
    t = datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    other_zone = t.astimezone(timezone(timedelta(hours=5)))
    assert params_hash("j", {"t": t}) == params_hash("j", {"t": other_zone})
    assert params_hash("j", {"t": t}) == params_hash("j", {"t": t + timedelta(microseconds=300)})
    assert params_hash("j", {"t": t}) != params_hash("j", {"t": t.isoformat()})


def test_params_that_cannot_be_stored_are_refused() -> None:
    with pytest.raises(ValueError):
        params_hash("j", {"$gt": 1})


def test_task_unique_by_is_key_or_params() -> None:
    assert Task("k", "job").unique_by == "key"
    assert Task("k", "job", {"a": 1}, unique_by="params").unique_by == "params"
    with pytest.raises(InvalidInput):
        Task("k", "job", unique_by="name")
