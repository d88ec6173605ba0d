"""The second real-server audit's correctness findings in the Mongo driver (issue 17 C, items
9-14), each on a fake of the collection that behaves as the server does where mongomock cannot
(replication lag, roles, server codes). The same paths on a real replica set: tests/real/test_audit_2.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.errors import WriteConcernError

from mscheduler import FakeClock, Publisher, Task
from mscheduler.drivers.base import ClaimParams
from mscheduler.drivers.mongo.driver import MongoDriver
from mscheduler.testing.mongomock import mongomock_database
from tests.scenarios.mongo_fakes import Database, ReplicaSet

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def wtimeout() -> WriteConcernError:
    return WriteConcernError("waiting for replication timed out", code=64, details={})


async def replicated_driver() -> tuple[MongoDriver, ReplicaSet]:
    rs = ReplicaSet()
    database = Database(mongomock_database(), {"mscheduler_tasks": rs.collection()})
    driver = MongoDriver(database, majority=False, backoff=0.0005, max_backoff=0.002)
    await driver.setup()
    return driver, rs


# -- item 9: a claim whose majority write timed out is on the primary, not in the majority view ----


async def test_a_claim_whose_majority_write_timed_out_is_found_on_the_primary_and_run() -> None:
    """In a PSA set with its secondary down every claim times out waiting for the majority (64)
    although the primary applied it. The recovery read must look where the write is: the primary
    at local read concern. (A majority read misses it: the consumer never runs the task, which
    later ends lost and costs budget.)"""
    driver, rs = await replicated_driver()
    await Publisher(driver, clock=FakeClock(NOW)).send_many([Task("t1", "job"), Task("t2", "job")])
    await rs.replicate()  # the tasks themselves are majority-committed; the claim will not be

    def refuse_majority() -> None:
        raise wtimeout()

    rs.collection().after["find_one_and_update"] = refuse_majority
    claimed = await driver.claim(ClaimParams("w1", ["job"], NOW, ["a1"], LEASE))
    assert [(c.key, c.attempt) for c in claimed] == [("t1", "a1")], "the applied claim is used"
    assert rs.reads["primary/local"] >= 1 and rs.reads["primary/majority"] == 0
    doc = await driver.get_task("t1")
    assert doc is not None
    assert [e["attempt"] for e in doc["state"]["worker_states"]] == ["a1"], "claimed once, not twice"
