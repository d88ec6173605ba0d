"""The stand-in's patches of mongomock (``mscheduler.testing.mongomock_patches``), one test per
patched rule, each checked against MongoDB's documented semantics (the manual's own examples
where it gives some). Every expression is evaluated twice, in an update pipeline and in an
aggregation, and must give the same value in both: the driver uses it in both places.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from pymongo import ReadPreference, UpdateOne, WriteConcern
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure, WriteError

from mscheduler.testing.mongomock import mongomock_database

WHEN = datetime(2030, 1, 1, 12, 0, 0)
DOC = {"_id": 1, "date": WHEN, "n": 3, "xs": [3, 1, 2], "none": None}


async def evaluate(expression: Any, doc: dict[str, Any] | None = None) -> Any:
    """``expression``'s value on ``doc``, by an update pipeline and by an aggregation (equal)."""
    database = mongomock_database()
    collection = database["c"]
    await collection.insert_one(dict(doc or DOC))
    aggregated = [d async for d in collection.aggregate([{"$project": {"_id": 0, "r": expression}}])]
    await collection.update_one({"_id": 1}, [{"$set": {"r": expression}}])
    updated = (await collection.find_one({"_id": 1})).get("r")
    assert aggregated == [{"r": updated}], (aggregated, updated)
    return updated


# -- expressions ----------------------------------------------------------------------------------


async def test_add_of_a_date_and_milliseconds_is_a_date() -> None:
    # the manual's example: a date plus 3 days of milliseconds
    assert await evaluate({"$add": ["$date", 3 * 24 * 60 * 60000]}) == WHEN + timedelta(days=3)
    assert await evaluate({"$add": [1000, "$date", 500]}) == WHEN + timedelta(milliseconds=1500)
    assert await evaluate({"$add": [{"$literal": WHEN}, {"$min": [30_000, "$n"]}]}) == WHEN + timedelta(
        milliseconds=3
    )
    assert await evaluate({"$add": ["$date", "$none"]}) is None, "null if an argument is null"
    assert await evaluate({"$add": ["$date", "$missing"]}) is None, "null if an argument is missing"
    assert await evaluate({"$add": [1, 2, "$n"]}) == 6, "numbers alone: a number"
    with pytest.raises(OperationFailure, match="only one date"):
        await evaluate({"$add": ["$date", "$date"]})


async def test_slice_takes_computed_positions_and_lengths() -> None:
    # the manual's examples
    assert await evaluate({"$slice": [[1, 2, 3], 1, 1]}) == [2]
    assert await evaluate({"$slice": [[1, 2, 3], -2]}) == [2, 3]
    assert await evaluate({"$slice": [[1, 2, 3], 15, 2]}) == []
    assert await evaluate({"$slice": [[1, 2, 3], -15, 2]}) == [1, 2]
    # computed: the length and the position are expressions
    assert await evaluate({"$slice": ["$xs", {"$subtract": ["$n", 1]}]}) == [3, 1]
    assert await evaluate({"$slice": ["$xs", {"$add": [0, 1]}, {"$max": [1, 2]}]}) == [1, 2]
    assert await evaluate({"$slice": ["$missing", 1]}) is None


async def test_reduce_folds_an_array() -> None:
    # the manual's examples
    concat = {"$concat": ["$$value", "$$this"]}
    assert await evaluate({"$reduce": {"input": ["a", "b", "c"], "initialValue": "", "in": concat}}) == "abc"
    both = {
        "sum": {"$add": ["$$value.sum", "$$this"]},
        "product": {"$multiply": ["$$value.product", "$$this"]},
    }
    start = {"sum": 5, "product": 2}
    assert await evaluate({"$reduce": {"input": [1, 2, 3, 4], "initialValue": start, "in": both}}) == {
        "sum": 15,
        "product": 48,
    }
    flat = {"$concatArrays": ["$$value", "$$this"]}
    nested = [[3, 4], [5, 6]]
    flattened = await evaluate({"$reduce": {"input": nested, "initialValue": [1, 2], "in": flat}})
    assert flattened == [1, 2, 3, 4, 5, 6]
    assert await evaluate({"$reduce": {"input": "$missing", "initialValue": 0, "in": 1}}) is None
    assert await evaluate({"$reduce": {"input": [], "initialValue": 7, "in": 1}}) == 7


async def test_index_of_array_finds_the_first_equal_element() -> None:
    # the manual's examples
    assert await evaluate({"$indexOfArray": [["a", "abc"], "a"]}) == 0
    assert await evaluate({"$indexOfArray": [[1, 2], 5]}) == -1
    assert await evaluate({"$indexOfArray": [["a", "abc", "de", ["de"]], ["de"]]}) == 3
    assert await evaluate({"$indexOfArray": [[1, 2, 3, 4, 5], 3, 0, 2]}) == -1, "end is exclusive"
    assert await evaluate({"$indexOfArray": [[1, 2, 3, 1], 1, 1]}) == 3, "from start"
    assert await evaluate({"$indexOfArray": ["$missing", "a"]}) is None
    assert await evaluate({"$indexOfArray": ["$xs", "$n"]}) == 0


async def test_not_of_a_one_element_array_negates_the_element() -> None:
    # the manual's examples: {$not: [true]} is false, {$not: [[false]]} is false (an array is true)
    assert await evaluate({"$not": [True]}) is False
    assert await evaluate({"$not": [[False]]}) is False
    assert await evaluate({"$not": [False]}) is True
    assert await evaluate({"$not": [None]}) is True
    assert await evaluate({"$not": [{"$in": ["$n", [1, 2]]}]}) is True
    assert await evaluate({"$not": [{"$in": ["$n", [3]]}]}) is False


async def test_expressions_inside_an_array_literal_are_evaluated() -> None:
    assert await evaluate(["$n", {"$add": [1, 2]}, "x"]) == [3, 3, "x"]
    assert await evaluate(["$missing", 1]) == [None, 1], "a missing field inside an array is null"
    assert await evaluate({"$concatArrays": ["$xs", [{"k": "$n"}]]}) == [3, 1, 2, {"k": 3}]
    assert await evaluate({"$literal": ["$n"]}) == ["$n"], "$literal is not evaluated"


async def test_sum_max_min_of_one_array_expression_take_its_elements() -> None:
    # with a single operand that is an array, $sum / $max / $min traverse into it
    assert await evaluate({"$sum": {"$concatArrays": ["$xs", [4]]}}) == 10
    doubled = {"$map": {"input": "$xs", "as": "x", "in": {"$multiply": ["$$x", 2]}}}
    assert await evaluate({"$max": doubled}) == 6
    above_one = {"$filter": {"input": "$xs", "as": "x", "cond": {"$gt": ["$$x", 1]}}}
    assert await evaluate({"$min": above_one}) == 2
    # nulls are skipped; no value at all is null
    assert await evaluate({"$max": {"$map": {"input": "$xs", "as": "x", "in": None}}}) is None
    assert await evaluate({"$max": {"$concatArrays": [[None], ["$date"]]}}) == WHEN
    assert await evaluate({"$sum": "$xs"}) == 6, "a field path, as before"
    assert await evaluate({"$max": [1, "$n"]}) == 3, "a list of operands, as before"


# -- commands -------------------------------------------------------------------------------------


async def _collection() -> Any:
    collection = mongomock_database()["c"]
    await collection.insert_many([{"_id": i, "a": i % 2} for i in range(4)])
    await collection.create_index("a", name="by_a")
    return collection


async def test_a_hint_naming_an_index_is_taken_by_every_command() -> None:
    collection = await _collection()
    await collection.update_one({"a": 1}, {"$set": {"b": 1}}, hint="by_a")
    await collection.update_many({"a": 1}, {"$set": {"b": 2}}, hint=[("a", 1)])
    await collection.find_one_and_update({"a": 0}, {"$set": {"b": 3}}, hint="_id_")
    await collection.bulk_write([UpdateOne({"a": 0}, {"$set": {"c": 1}}, hint="by_a")])
    assert [d["_id"] async for d in collection.find({"a": 1}).hint("by_a")] == [1, 3]
    assert await collection.count_documents({"a": 1}, hint="by_a") == 2
    assert len([d async for d in collection.aggregate([{"$match": {"a": 1}}], hint="by_a")]) == 2
    await collection.delete_many({"a": 1}, hint="by_a")
    assert await collection.count_documents({}) == 2


async def test_a_hint_naming_no_index_is_refused_with_code_2() -> None:
    collection = await _collection()
    with pytest.raises(WriteError, match="hint provided does not correspond to an existing index") as caught:
        await collection.update_one({"a": 1}, {"$set": {"b": 1}}, hint="nope")
    assert caught.value.code == 2
    with pytest.raises(WriteError):
        await collection.delete_one({"a": 1}, hint=[("b", 1)])
    with pytest.raises(OperationFailure) as read:
        [d async for d in collection.find({}).hint("nope")]
    assert read.value.code == 2
    with pytest.raises(OperationFailure):
        await collection.find_one_and_update({"a": 0}, {"$set": {"b": 3}}, hint="nope")
    with pytest.raises(OperationFailure):
        await collection.count_documents({}, hint="nope")
    with pytest.raises(BulkWriteError) as bulk:
        await collection.bulk_write([UpdateOne({"a": 0}, {"$set": {"c": 1}}, hint="nope")])
    assert bulk.value.details["writeErrors"][0]["code"] == 2
    assert await collection.count_documents({"b": {"$exists": True}}) == 0, "nothing was written"


async def test_pipeline_stages_may_be_raw_bson_as_pymongo_sends_them() -> None:
    collection = await _collection()
    stage = RawBSONDocument(bson.encode({"$set": {"t": {"$add": [{"$literal": WHEN}, 1000]}}}))
    await collection.update_one({"_id": 0}, [stage])
    await collection.find_one_and_update({"_id": 1}, [stage])
    await collection.bulk_write([UpdateOne({"_id": 2}, [stage])])
    times = [d.get("t") async for d in collection.find({}, sort=[("_id", 1)])]
    assert times == [WHEN + timedelta(seconds=1)] * 3 + [None]


async def test_coll_mod_changes_a_ttl_index_period() -> None:
    database = mongomock_database()
    await database["c"].create_index("t", name="ttl", expireAfterSeconds=60)
    reply = await database.command({"collMod": "c", "index": {"name": "ttl", "expireAfterSeconds": 120}})
    assert (reply["expireAfterSeconds_old"], reply["expireAfterSeconds_new"]) == (60, 120)
    assert (await database["c"].index_information())["ttl"]["expireAfterSeconds"] == 120
    with pytest.raises(OperationFailure) as caught:
        await database.command({"collMod": "c", "index": {"name": "nope", "expireAfterSeconds": 1}})
    assert caught.value.code == 27


async def test_a_command_it_does_not_have_is_answered_as_a_server_does() -> None:
    database = mongomock_database()
    assert (await database.command("ping"))["ok"] == 1
    assert (await database.command("buildInfo"))["version"]
    with pytest.raises(OperationFailure, match="no such command") as caught:
        await database.command("hello")
    assert caught.value.code == 59


async def test_watch_is_refused_as_on_a_server_without_a_replica_set() -> None:
    with pytest.raises(OperationFailure, match="only supported on replica sets") as caught:
        mongomock_database()["c"].watch([])
    assert caught.value.code == 40573


async def test_with_options_keeps_the_async_api() -> None:
    collection = mongomock_database()["c"]
    other = collection.with_options(
        write_concern=WriteConcern(w="majority", wtimeout=1000), read_preference=ReadPreference.PRIMARY
    )
    assert inspect.iscoroutinefunction(other.find_one)
    await other.insert_one({"_id": 1})
    assert await collection.find_one({"_id": 1}) == {"_id": 1}, "the same collection"


async def test_a_partial_unique_index_holds_the_documents_its_filter_matches() -> None:
    collection = mongomock_database()["c"]
    # two documents outside a partial unique index, equal on its key
    await collection.insert_many([{"_id": 1, "u": None}, {"_id": 2, "u": None}, {"_id": 3, "u": "x"}])
    options = {"name": "u", "unique": True, "partialFilterExpression": {"u": {"$type": "string"}}}
    assert await collection.create_index("u", **options) == "u"
    assert await collection.create_index("u", **options) == "u", "the same spec again: nothing to do"
    with pytest.raises(OperationFailure, match="different options"):
        await collection.create_index("u", name="u")
    with pytest.raises(DuplicateKeyError):
        await collection.insert_one({"_id": 4, "u": "x"})
    await collection.insert_one({"_id": 5, "u": None})  # outside the filter: not held
    later = {"_id": {"$gt": 1}}  # holds 2 and 5: both None
    with pytest.raises(DuplicateKeyError):
        await collection.create_index("u", name="u2", unique=True, partialFilterExpression=later)
