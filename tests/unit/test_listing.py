"""Listing filters (an allow-list of typed values) and cursors (mscheduler.domain.listing), and the
key-prefix range of the Mongo listing."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.listing import (
    BY_CREATED,
    BY_FINISHED,
    BY_KEY,
    ListParams,
    decode_cursor,
    encode_cursor,
    list_params,
    prefix_end,
)
from mscheduler.domain.model import TaskInfo, TaskOption
from mscheduler.domain.state import TERMINAL
from mscheduler.drivers.mongo.common import (
    AIMED_AT_GROUPS,
    CREATED_INDEX,
    FINISHED_INDEX,
    GROUP_INDEX,
    KEY_INDEX,
    NAME_INDEX,
    STATUS_INDEX,
    WORKER_INDEX,
)
from mscheduler.drivers.mongo.queries import list_query

T = datetime(2030, 1, 1, tzinfo=UTC)


def _info(key: str, created: datetime = T) -> TaskInfo:
    from mscheduler.domain.model import TaskOption
    from mscheduler.drivers.base import NewTask, new_task_document

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
        {"finished_from": "2030-01-01T00:00:00Z"},
        {"finished_from": datetime(2030, 1, 1)},
        {"finished_to": {"$gt": ""}},
        {"finished_from": T, "finished_to": T - timedelta(seconds=1)},
        # both round up to the same stored millisecond: an empty range
        {"finished_from": T + timedelta(microseconds=1), "finished_to": T + timedelta(milliseconds=1)},
        {"group": {"$gt": ""}},
        {"group": "$where"},
        {"group": "g\x00"},
        {"group": "gpu eu"},
        {"group": ["gpu"]},
        {"group": ""},
        {"group": "g" * 201},
        {"cursor": {"$gt": ""}},
        {"cursor": "garbage!"},
        {"cursor": "x" * 5000},
        {"limit": 0},
        {"limit": 1001},
        {"limit": True},
    ],
    ids=repr,
)
def test_bad_filters_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        list_params(**bad)


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
    # the cursor: one branch per sort field, each with every filter (a tight index range each)
    assert filter_ == {
        "$or": [
            {"$and": [{"state.create_time": {"$gte": lower}}, {"state.create_time": {"$gt": lower}}]},
            {
                "$and": [
                    {"state.create_time": {"$gte": lower}},
                    {"state.create_time": lower, "key": {"$gt": "k"}},
                ]
            },
        ]
    }
    assert sort == [("state.create_time", 1), ("key", 1)]


def test_group_and_finished_filters_become_params_and_choose_the_order() -> None:
    params = list_params(
        group="gpu.eu-1",
        finished_from=T + timedelta(microseconds=1),
        finished_to=datetime(2030, 1, 1, 2, tzinfo=timezone(timedelta(hours=1))),
    )
    assert params == ListParams(
        limit=101,
        group="gpu.eu-1",
        finished_from=T + timedelta(milliseconds=1),  # rounded up, like the created range
        finished_to=T + timedelta(hours=1),
    )
    assert params.order == BY_FINISHED
    assert list_params(finished_to=T).order == BY_FINISHED
    assert list_params(group="gpu").order == BY_CREATED
    assert list_params(group="gpu", key_prefix="k", finished_from=T).order == BY_KEY
    # the same names TaskOption.specific_groups accepts
    for group in ("gpu", "a:b", "x_y.z-1"):
        assert TaskOption(specific_groups=(group,)).specific_groups == (group,)
        assert list_params(group=group).group == group


def test_finished_cursors_carry_the_finish_time() -> None:
    info = _info("k1").model_copy(update={"finish_time": T + timedelta(seconds=9)})
    cursor = encode_cursor(BY_FINISHED, info)
    assert decode_cursor(cursor, BY_FINISHED) == (T + timedelta(seconds=9), "k1")
    params = list_params(cursor=cursor, finished_from=T, group="g")
    assert (params.after_time, params.after_key) == (T + timedelta(seconds=9), "k1")
    for other in (BY_CREATED, BY_KEY):
        with pytest.raises(InvalidInput, match="another order"):
            decode_cursor(cursor, other)
    with pytest.raises(InvalidInput, match="another order"):
        list_params(cursor=encode_cursor(BY_CREATED, info), finished_to=T)
    with pytest.raises(ValueError, match="no finish time"):
        encode_cursor(BY_FINISHED, _info("k2"))


def test_finished_and_group_listings_name_their_index_and_bound_it() -> None:
    def query(**kwargs: object) -> tuple[dict[str, object], list[tuple[str, int]], str]:
        return list_query(ListParams(**kwargs))  # type: ignore[arg-type]

    naive = T.replace(tzinfo=None)
    filter_, sort, index = query(finished_from=T, name="a", group="g", worker_id="w")
    assert index == FINISHED_INDEX and sort == [("state.finish_time", 1), ("key", 1)]
    assert filter_["state.status"] == {"$in": list(TERMINAL)}  # one range per terminal status
    assert filter_["state.finish_time"] == {"$gte": naive}
    filter_, _, index = query(
        finished_to=T, status="failed", after_time=T - timedelta(hours=1), after_key="k"
    )
    assert index == FINISHED_INDEX
    base = {"state.status": "failed", "state.finish_time": {"$gte": naive - timedelta(hours=1), "$lt": naive}}
    assert filter_ == {
        "$or": [
            {"$and": [base, {"state.finish_time": {"$gt": naive - timedelta(hours=1)}}]},
            {"$and": [base, {"state.finish_time": naive - timedelta(hours=1), "key": {"$gt": "k"}}]},
        ]
    }
    # a finished range with a key prefix: the key index, the range checked on the documents
    filter_, sort, index = query(key_prefix="k", finished_from=T, after_key="k1")
    assert index == KEY_INDEX and sort == [("key", 1)] and "$or" not in filter_
    assert filter_["state.finish_time"] == {"$gte": naive}
    # a group: the partial group index, whose clause the query states
    filter_, sort, index = query(group="g", status="pending", created_to=T)
    assert index == GROUP_INDEX and sort == [("state.create_time", 1), ("key", 1)]
    assert filter_ == {
        "option.specific_groups": "g",
        **AIMED_AT_GROUPS,
        "state.status": "pending",
        "state.create_time": {"$lt": naive},
    }
    assert query(group="g", worker_id="w")[2] == WORKER_INDEX
    assert AIMED_AT_GROUPS.items() <= query(group="g", worker_id="w")[0].items()
