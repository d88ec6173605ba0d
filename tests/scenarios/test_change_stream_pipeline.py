"""The Mongo driver's change-stream pipeline and event parsing (issue 6, A7).

mongomock cannot watch, but it can run the same stages as an aggregation over documents shaped
like change events, which checks the pipeline's logic (a real server runs it in
tests/real/test_hardening.py). What a real change stream adds, resume tokens and server-side
filtering, is covered there.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from mscheduler.drivers.base import StreamPosition
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database

WHEN = datetime(2030, 1, 1, 12, 0)


def _insert(key: str, name: str) -> dict[str, Any]:
    return {
        "_id": {"_data": f"i-{key}"},
        "operationType": "insert",
        "documentKey": {"_id": key},
        "fullDocument": {
            "key": key,
            "name": name,
            "option": {"specific_worker_ids": []},
            "state": {"claim_at": WHEN, "claimers": [f"{name}|*"], "worker_states": []},
        },
    }


def _update(key: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "_id": {"_data": f"u-{key}"},
        "operationType": "update",
        "documentKey": {"_id": key},
        "updateDescription": {"updatedFields": fields, "removedFields": [], "truncatedArrays": []},
    }


async def _run(events: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    database = mongomock_database()
    driver = MongoDriver(database)
    scratch = database["events"]
    await scratch.insert_many(events)
    cursor = scratch.aggregate(driver._watch_pipeline(names))
    return [doc async for doc in cursor]


async def test_inserts_and_claimable_updates_of_our_names_pass_pings_do_not() -> None:
    events = [
        _insert("a", "job"),
        _insert("b", "other"),
        # the task became claimable by anyone (a retry after a failure)
        _update("c", {"state.claimers": ["job|*"], "state.claim_at": WHEN, "state.status": "pending"}),
        # aimed at worker w1, reported element-wise as a real server may do for arrays
        _update("d", {"state.claimers.0": "job|w1"}),
        # a ping: only the lease moved
        _update("e", {"state.worker_states.0.ping_expire_time": WHEN}),
        # claimed: no longer claimable (claimers emptied) — nobody needs it
        _update("f", {"state.claimers": [], "state.claim_at": None}),
        # claimable, but for another name
        _update("g", {"state.claimers": ["other|*"], "state.claim_at": WHEN}),
    ]
    passed = await _run(events, ["job"])
    assert [doc["documentKey"]["_id"] for doc in passed] == ["a", "c", "d"]
    parsed = [MongoDriver._event(doc, doc["_id"]) for doc in passed]
    assert all(event is not None for event in parsed)
    a, c, d = parsed
    assert a is not None and (a.key, a.name, a.claimers) == ("a", "job", ("job|*",))
    assert c is not None and (c.key, c.name, c.claimers, c.claim_at is not None) == (
        "c",
        "job",
        ("job|*",),
        True,
    )
    assert d is not None and (d.key, d.claimers, d.claim_at) == ("d", ("job|w1",), None)
    assert a.claimers_complete and c.claimers_complete and not d.claimers_complete


async def test_an_event_of_another_shape_is_skipped_not_fatal() -> None:
    odd = {
        "_id": {"_data": "x"},
        "operationType": "update",
        "documentKey": {"_id": 12345},
        "ms": {"claimers": ["job|*"]},
    }
    assert MongoDriver._event(odd, odd["_id"]) is None
    assert MongoDriver._event({"operationType": "insert"}, None) is None


def test_a_position_marker_carries_the_token() -> None:
    assert StreamPosition({"_data": "abc"}).token == {"_data": "abc"}


async def test_stop_requests_pass_whatever_the_name_checkpoints_do_not() -> None:
    stop = {"action": "cancel", "time": WHEN, "attempts": ["tok1"]}
    events = [
        # a cancel of a running task: state.stop names the running attempts (no name in the event)
        _update("a", {"state.cancelled": {"reason": "", "time": WHEN}, "state.stop": stop}),
        # a stopping pause, with the claimers emptied as well
        _update("b", {"state.stop": stop | {"action": "pause"}, "state.claimers": [], "state.paused": True}),
        # the server reported the stop field by field: the attempts are unknown
        _update("c", {"state.stop.time": WHEN, "state.stop.attempts": ["tok2"]}),
        # a cancel of a pending task: nobody runs it, state.stop stays null
        _update("d", {"state.cancelled": {"reason": "", "time": WHEN}, "state.stop": None}),
        # resume clears the stop
        _update("e", {"state.stop": None, "state.paused": False, "state.claimers": ["other|*"]}),
        # a ping that carries a checkpoint and progress
        _update(
            "f",
            {
                "state.checkpoint": {"data": {"done": 3}, "attempt": "tok3", "seq": 1},
                "state.progress": {"fraction": 0.3},
                "state.worker_states.0.ping_expire_time": WHEN,
            },
        ),
    ]
    passed = await _run(events, ["job"])
    assert [doc["documentKey"]["_id"] for doc in passed] == ["a", "b", "c"]
    a, b, c = (MongoDriver._event(doc, doc["_id"]) for doc in passed)
    assert a is not None and (a.key, a.stop, a.stop_attempts, a.claimers) == ("a", "cancel", ("tok1",), ())
    assert b is not None and (b.key, b.stop, b.stop_attempts) == ("b", "pause", ("tok1",))
    assert c is not None and (c.key, c.stop, c.stop_attempts) == ("c", "unknown", None)
    # events about claims carry no stop
    (plain,) = await _run([_update("g", {"state.claimers": ["job|*"]})], ["job"])
    event = MongoDriver._event(plain, plain["_id"])
    assert event is not None and event.stop is None and event.stop_attempts is None
