"""The Mongo driver's update pipelines made from templates: the same pipeline as building it
afresh, and its constant stages sent as BSON already (``RawBSONDocument``) the same bytes on the
wire as encoding the dicts each time, so a server runs exactly the command the dicts make."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import bson
import pytest
from bson.datetime_ms import _datetime_to_millis
from bson.raw_bson import RawBSONDocument

from mscheduler.drivers.base import ClaimParams, FinishParams
from mscheduler.drivers.mongo.common import (
    WORKER_STATES,
    _build_derive_stages,
    _millis,
    derive_stages,
    from_mongo,
    from_mongo_in_place,
    to_mongo,
)
from mscheduler.drivers.mongo.driver import MongoDriver

TIMES = [
    datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
    datetime(2026, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=-5))),
    datetime(2030, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
    datetime(1969, 7, 20, 20, 17, 40, 500500, tzinfo=UTC),  # before the epoch: negative milliseconds
    datetime(1971, 2, 3, 4, 5, 6, 789000, tzinfo=UTC),  # the mark itself
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=14))),
]


def wire(pipeline: list[Any]) -> bytes:
    return bson.encode({"u": pipeline})


@pytest.mark.parametrize("now", TIMES)
def test_derive_stages_are_the_pipeline_built_afresh_and_the_same_bytes_raw(now: datetime) -> None:
    fresh = _build_derive_stages(to_mongo(now))
    assert derive_stages(now) == fresh
    assert wire(derive_stages(now, raw=True)) == wire(fresh)


@pytest.mark.parametrize(
    "now", [*TIMES, datetime(2026, 5, 6, 7, 8, 9, 1), datetime(1, 1, 1), datetime(1960, 1, 1, 0, 0, 0, 999)]
)
def test_bson_milliseconds_as_pymongo_counts_them(now: datetime) -> None:
    assert _millis(now) == _datetime_to_millis(now)


def test_a_filled_template_shares_no_container_on_the_way_to_the_time() -> None:
    first, second = derive_stages(TIMES[0]), derive_stages(TIMES[2])
    assert first[0]["$set"]["state.update_time"] == {"$literal": to_mongo(TIMES[0])}
    assert second[0]["$set"]["state.update_time"] == {"$literal": to_mongo(TIMES[2])}
    assert first[0] is not second[0] and first[-1] is not second[-1]


class _Collection:
    name = "tasks"

    def with_options(self, **options: Any) -> _Collection:
        return self

    async def find_one(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Database:
    """A fake of PyMongo's database (the driver sends it dicts, unless told otherwise)."""

    name = "db"

    def __getitem__(self, name: str) -> _Collection:
        return _Collection()


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "cancelled", "released"])
async def test_a_finish_sends_the_derive_stages_as_bson_with_the_bytes_of_the_dicts(outcome: str) -> None:
    driver = MongoDriver(_Database())
    await driver.known_layout()  # (a store without a layout: one partition)
    item = FinishParams(
        "k1",
        "w1",
        "a1",
        TIMES[0],
        outcome,
        result={"n": 1},
        error={"type": "E", "message": "m"} if outcome == "failed" else None,
        retry_at=TIMES[2] if outcome == "failed" else None,
    )
    _, update = driver._finish_op(item)
    first, *derive = update
    assert all(isinstance(stage, RawBSONDocument) for stage in derive)
    assert wire(update) == wire([first, *derive_stages(item.now)])


async def test_a_claim_sends_the_derive_stages_as_bson_with_the_bytes_of_the_dicts() -> None:
    sent: list[Any] = []
    params = ClaimParams("w1", ["job"], TIMES[0], ["a1"], max_lease=timedelta(seconds=20))
    driver = MongoDriver(_Database())
    await driver.known_layout()

    async def find_one_and_update(filter_: Any, update: Any, **kwargs: Any) -> None:
        sent.append(update)

    driver.tasks.find_one_and_update = find_one_and_update
    assert await driver._claim_one(params, "a1") is None
    (update,) = sent
    append, trim, *derive = update
    assert isinstance(trim, RawBSONDocument) and all(isinstance(stage, RawBSONDocument) for stage in derive)
    assert wire(update) == wire([append, bson.decode(trim.raw), *derive_stages(params.now)])


def test_raw_derive_stages_of_alternating_times_are_each_times_bytes_in_a_list_of_its_own() -> None:
    # the stages of the latest time are kept for the next write of that time: a write of another
    # time in between must not get them, and no caller's list is another's
    times = [TIMES[0], TIMES[2], TIMES[2], TIMES[0], TIMES[3]]
    lists = [derive_stages(now, raw=True) for now in times]
    for now, stages in zip(times, lists, strict=True):
        assert wire(stages) == wire(_build_derive_stages(to_mongo(now)))
    assert len({id(stages) for stages in lists}) == len(lists)
    lists[1].append({"$set": {"x": 1}})
    assert wire(derive_stages(TIMES[2], raw=True)) == wire(_build_derive_stages(to_mongo(TIMES[2])))


def test_in_place_makes_the_datetimes_of_a_decoded_document_aware_as_in_does() -> None:
    naive = datetime(2026, 5, 6, 7, 8, 9, 123000)
    doc = bson.decode(
        bson.encode({"a": naive, "b": [naive, {"c": naive, "d": "x"}], "e": {"f": [1, "s"]}, "g": None})
    )
    expected = from_mongo(bson.decode(bson.encode(doc)))
    entries = doc["b"]
    assert from_mongo_in_place(doc) is doc and doc["b"] is entries  # converted where it is
    assert doc == expected and doc["a"].tzinfo is UTC and doc["b"][1]["c"] == naive.replace(tzinfo=UTC)


async def test_the_claims_of_one_call_share_the_filter_and_each_sends_its_own_attempt() -> None:
    sent: list[tuple[Any, Any]] = []
    params = ClaimParams("w1", ["job"], TIMES[0], ["a1", "a2", "a3"])
    driver = MongoDriver(_Database())
    await driver.known_layout()

    async def find_one_and_update(filter_: Any, update: Any, **kwargs: Any) -> None:
        sent.append((filter_, update))

    driver.tasks.find_one_and_update = find_one_and_update
    assert await driver.claim(params) == []
    attempts = [update[0]["$set"][WORKER_STATES]["$concatArrays"][1][0]["attempt"] for _, update in sent]
    assert sorted(attempts) == ["a1", "a2", "a3"]
    fresh_filter = driver._claim_filter(params)
    assert all(filter_ == fresh_filter for filter_, _ in sent)
    for attempt, (_, update) in zip(attempts, sent, strict=True):
        assert update[0]["$set"][WORKER_STATES]["$concatArrays"][1][0] == driver._claim_entry(params, attempt)
    # another call (another time) is built afresh
    later = ClaimParams("w1", ["job"], TIMES[2], ["a4"])
    assert await driver.claim(later) == []
    assert sent[-1][0] == driver._claim_filter(later) != fresh_filter
