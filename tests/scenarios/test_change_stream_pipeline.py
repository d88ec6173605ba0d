"""The Mongo driver's change-stream pipeline and event parsing (issue 6, A7; issue 18.6).

mongomock cannot watch, but it can run the same stages as an aggregation over documents shaped
like change events, which checks the pipeline's logic (a real server runs it in
tests/real/test_hardening.py). What a real change stream adds, resume tokens and server-side
filtering, is covered there.

The stream is shared by every subscriber of a process (drivers/streams.py): the pipeline passes
inserts and the updates that bumped the top-level ``wake`` (the $match the server pushes down to
its oplog scan), and each subscriber takes the names it handles (``wanted_by``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from mscheduler.drivers.base import ChangeEvent, StreamPosition
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.drivers.streams import wanted_by
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
    """The events the pipeline passes that a subscriber of ``names`` gets (parsed, then its
    filter), as the raw documents."""
    database = mongomock_database()
    driver = MongoDriver(database)
    scratch = database["events"]
    await scratch.insert_many(events)
    cursor = scratch.aggregate(driver._watch_pipeline())
    admit = wanted_by(names)
    passed = []
    async for doc in cursor:
        event = MongoDriver._event(doc, doc["_id"])
        if event is not None and isinstance(admit(event), ChangeEvent):
            passed.append(doc)
    return passed


async def test_inserts_and_claimable_updates_of_our_names_pass_pings_do_not() -> None:
    events = [
        _insert("a", "job"),
        _insert("b", "other"),
        # the task became claimable by anyone (a retry after a failure): the write bumped wake
        _update(
            "c", {"state.claimers": ["job|*"], "state.claim_at": WHEN, "state.status": "pending", "wake": 2}
        ),
        # aimed at worker w1, reported element-wise as a real server may do for arrays
        _update("d", {"state.claimers.0": "job|w1", "wake": 1}),
        # a ping: only the lease moved (no wake: the server drops it in its oplog scan)
        _update("e", {"state.worker_states.0.ping_expire_time": WHEN}),
        # claimed: no longer claimable (claimers emptied, wake unchanged) — nobody needs it
        _update("f", {"state.claimers": [], "state.claim_at": None}),
        # claimable, but for another name: passed by the stream, not taken by this subscriber
        _update("g", {"state.claimers": ["other|*"], "state.claim_at": WHEN, "wake": 3}),
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
        _update("a", {"state.cancelled": {"reason": "", "time": WHEN}, "state.stop": stop, "wake": 4}),
        # a stopping pause, with the claimers emptied as well
        _update(
            "b",
            {"state.stop": stop | {"action": "pause"}, "state.claimers": [], "state.paused": True, "wake": 2},
        ),
        # the server reported the stop field by field: the attempts are unknown
        _update("c", {"state.stop.time": WHEN, "state.stop.attempts": ["tok2"], "wake": 7}),
        # a cancel of a pending task: nobody runs it, state.stop stays null, wake is not bumped
        _update("d", {"state.cancelled": {"reason": "", "time": WHEN}, "state.stop": None}),
        # resume clears the stop (claimable again, by another name's workers)
        _update("e", {"state.stop": None, "state.paused": False, "state.claimers": ["other|*"], "wake": 5}),
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
    (plain,) = await _run([_update("g", {"state.claimers": ["job|*"], "wake": 1})], ["job"])
    event = MongoDriver._event(plain, plain["_id"])
    assert event is not None and event.stop is None and event.stop_attempts is None


async def test_the_pipeline_leads_with_a_match_the_server_can_push_down() -> None:
    """18.6: the first stage is a $match on ``operationType`` and on a top-level field of
    ``updateDescription.updatedFields`` only: the predicates the server rewrites into its oplog
    scan (a $match after another stage, or on a dotted path such as ``state.claimers``, is run on
    every event after it was built, every ping included)."""
    (first, *_) = MongoDriver(mongomock_database(), create_indexes=True)._watch_pipeline()
    assert list(first) == ["$match"]

    def paths(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [p for k, v in value.items() for p in ([k] if not k.startswith("$") else []) + paths(v)]
        if isinstance(value, list):
            return [p for v in value for p in paths(v)]
        return []

    for path in paths(first["$match"]):
        assert path == "operationType" or (
            path.startswith("updateDescription.updatedFields.") and path.count(".") == 2
        ), path


async def test_only_writes_that_wake_someone_change_the_wake_field() -> None:
    """18.6: what the stream's pushed-down $match sees. A claim, a ping and a success change no
    ``wake`` (the stream builds no event for them); a failure that makes the task claimable again,
    an edit that aims it at new workers and a cancel of a running attempt bump it."""
    from datetime import UTC, timedelta

    from mscheduler import FakeClock, Publisher, Task, TaskOption
    from mscheduler.drivers.base import ClaimParams, ControlParams, FinishParams, PingParams

    now = datetime(2030, 1, 1, tzinfo=UTC)
    database = mongomock_database()
    driver = MongoDriver(database)
    await driver.setup()
    raw = database["mscheduler_tasks"]

    async def wake(key: str) -> Any:
        doc = await raw.find_one({"_id": key})
        return doc.get("wake") if doc else None

    publisher = Publisher(driver, clock=FakeClock(now))
    await publisher.send(Task("t", "job", option=TaskOption(max_unexpected_retries=5)))
    (claimed,) = await driver.claim(ClaimParams("w1", ["job"], now, ["a1"]))
    assert claimed.key == "t"
    await driver.ping(PingParams("w1", now, {now + timedelta(seconds=30): {claimed.key: "a1"}}))
    assert await wake("t") is None, "a claim and a ping wake nobody"
    error = {"type": "E", "message": "boom", "traceback": None}
    retry = FinishParams("t", "w1", "a1", now, "failed", error=error, retry_at=now + timedelta(seconds=5))
    assert await driver.finish([retry]) == [True]
    assert await wake("t") == 1, "claimable again: the stream passes it"
    assert len(await driver.claim(ClaimParams("w2", ["job"], now + timedelta(seconds=5), ["a2"]))) == 1
    done = FinishParams("t", "w2", "a2", now + timedelta(seconds=6), "succeeded")
    assert await driver.finish([done]) == [True]
    assert await wake("t") == 1, "a claim and a success wake nobody"
    await publisher.send(Task("u", "job"))
    (other,) = await driver.claim(ClaimParams("w3", ["job"], now, ["a3"]))
    assert other.key == "u"
    await driver.control_task(ControlParams("u", "cancel", ("running",), now))
    assert await wake("u") == 1, "a cancel of a running attempt: the stream passes the stop"
