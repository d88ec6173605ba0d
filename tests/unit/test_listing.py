"""Listing filters (an allow-list of typed values) and cursors (mscheduler.listing), and the
key-prefix range of the Mongo listing."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from mscheduler.drivers.base import ListParams
from mscheduler.drivers.mongo_common import CREATED_INDEX, KEY_INDEX, NAME_INDEX, STATUS_INDEX, WORKER_INDEX
from mscheduler.drivers.mongo_queries import list_query, prefix_end
from mscheduler.exceptions import InvalidInput
from mscheduler.listing import BY_CREATED, BY_KEY, decode_cursor, encode_cursor, list_params
from mscheduler.model import TaskInfo

T = datetime(2030, 1, 1, tzinfo=UTC)


def _info(key: str, created: datetime = T) -> TaskInfo:
    from mscheduler.drivers.base import NewTask, new_task_document
    from mscheduler.model import TaskOption

    return TaskInfo.from_storage(
        new_task_document(NewTask(key, "job", None, TaskOption().to_storage(created)), created)
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"status": {"$gt": ""}},
        {"status": "$where"},
        {"status": "lost"},
        {"status": ["pending"]},
        {"name": "$where"},
        {"name": {"$ne": None}},
        {"key_prefix": {"$gt": ""}},
        {"key_prefix": "$gt"},
        {"key_prefix": "a$b"},
        {"key_prefix": ""},
        {"key_prefix": "x" * 513},
        {"key_prefix": "\ud800"},
        {"worker_id": "$ne"},
        {"worker_id": ["w1"]},
        {"worker_id": "w\x00"},
        {"created_from": "2030-01-01T00:00:00Z"},
        {"created_from": datetime(2030, 1, 1)},
        {"created_to": 0},
        {"created_from": T, "created_to": T},
        {"cursor": {"$gt": ""}},
        {"cursor": "garbage!"},
        {"cursor": "x" * 5000},
        {"limit": 0},
        {"limit": 1001},
        {"limit": True},
        {"skip": -1},
        {"skip": 1.5},
    ],
    ids=repr,
)
def test_bad_filters_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        list_params(**bad)  # type: ignore[arg-type]


def test_good_filters_become_params_asking_one_more() -> None:
    params = list_params(
        status="pending",
        name="job.a",
        worker_id="host-1-abc",
        created_from=datetime(2030, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
        created_to=T + timedelta(microseconds=1500),
        limit=10,
    )
    assert params == ListParams(
        status="pending",
        name="job.a",
        limit=11,
        worker_id="host-1-abc",
        created_from=T,  # in UTC
        created_to=T + timedelta(milliseconds=2),  # rounded up to the stored precision
    )


def test_cursors_round_trip_and_know_their_order() -> None:
    info = _info("k/ü", T + timedelta(milliseconds=5))
    by_created = encode_cursor(BY_CREATED, info)
    assert decode_cursor(by_created, BY_CREATED) == (T + timedelta(milliseconds=5), "k/ü")
    assert set(by_created) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert decode_cursor(encode_cursor(BY_KEY, info), BY_KEY) == (None, "k/ü")
    with pytest.raises(InvalidInput, match="another order"):
        decode_cursor(by_created, BY_KEY)
    params = list_params(cursor=by_created, status="failed")
    assert (params.after_time, params.after_key) == (T + timedelta(milliseconds=5), "k/ü")
    with pytest.raises(InvalidInput, match="skip"):
        list_params(cursor=by_created, skip=3)


@pytest.mark.parametrize(
    "body",
    [
        {"v": 2, "o": "created", "k": "a", "t": "2030-01-01T00:00:00+00:00"},
        {"v": 1, "o": "created", "k": "a", "t": "2030-01-01T00:00:00"},
        {"v": 1, "o": "created", "k": "a"},
        {"v": 1, "o": "created", "k": {"$gt": ""}, "t": "2030-01-01T00:00:00+00:00"},
        {"v": 1, "o": "key", "k": ""},
        {"v": 1, "o": "sideways", "k": "a"},
        ["v", 1],
    ],
)
def test_forged_cursors_are_refused(body: object) -> None:
    cursor = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
    with pytest.raises(InvalidInput, match="cursor"):
        decode_cursor(cursor, BY_CREATED)


def test_prefix_end_is_the_least_string_above_the_prefix() -> None:
    assert prefix_end("inv-") == "inv."
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff") is None
    assert prefix_end("\ud7ff") == "\ue000"


def test_each_mongo_listing_names_its_index() -> None:
    def index(**kwargs: object) -> str:
        return list_query(ListParams(**kwargs))[2]  # type: ignore[arg-type]

    assert index() == CREATED_INDEX
    assert index(status="pending") == STATUS_INDEX
    assert index(name="a") == index(name="a", status="failed") == NAME_INDEX
    assert index(worker_id="w", status="failed", name="a") == WORKER_INDEX
    assert index(key_prefix="a", worker_id="w") == KEY_INDEX
    filter_, sort, _ = list_query(ListParams(key_prefix="inv-", after_key="inv-3"))
    assert filter_ == {"key": {"$gte": "inv-", "$lt": "inv.", "$gt": "inv-3"}} and sort == [("key", 1)]
    filter_, sort, _ = list_query(
        ListParams(created_from=T, after_time=T + timedelta(seconds=1), after_key="k")
    )
    lower = datetime(2030, 1, 1, 0, 0, 1)  # naive UTC on the wire
    assert filter_ == {
        "$or": [{"state.create_time": {"$gt": lower}}, {"key": {"$gt": "k"}}],
        "state.create_time": {"$gte": lower},
    }
    assert sort == [("state.create_time", 1), ("key", 1)]
