"""Property-based run of every endpoint against the API's own OpenAPI schema (schemathesis, the
ASGI app in process, over a MemoryDriver with a few tasks, plans and a worker): no answer is a 5xx,
and every answer conforms to the schema (status code documented, body and content type as
declared). Bounded and derandomized, so it runs in seconds and the same way every time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from mscheduler import FakeClock, MemoryDriver, Operations, Plan, PlanTiming, Publisher, Task
from mscheduler.domain.schedule import EverySchedule
from mscheduler.drivers.base import ClaimParams, WorkerInfo
from mscheduler.remote.executors import RemoteExecutors
from mscheduler.web import create_app
from tests.web.support import ADMIN, TOKENS

EXAMPLES = 25  # per operation (24 of them): about 30 s on this machine
# Not ``positive_data_acceptance``: the domain refuses values a schema cannot describe (a cursor
# it did not make, '$' in a filter, a naive time, a bad cron expression) with a 422, by design.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
]


def _app() -> object:
    clock = FakeClock()
    driver = MemoryDriver(clock=clock, events=True)  # the event routes answer with events
    operations = Operations(driver, clock=clock)

    async def seed() -> None:
        await Publisher(driver, clock=clock).send_many([Task(k, "job", {"n": 1}) for k in ("0", "a", "x")])
        await driver.claim(ClaimParams("w1", ["job"], clock.now(), ["a1"]))
        await driver.register_worker(WorkerInfo("x", "host", 1, ("job",), 1, clock.now()))
        await operations.set_limit("x", max_running=2, rate="10/s")
        start = datetime(2030, 1, 1, tzinfo=UTC)
        for plan_id in ("0", "x"):
            timing = PlanTiming(schedule=EverySchedule(interval=60, start=start))
            await operations.add_plan(Plan(plan_id=plan_id, name="job", timing=timing))

    asyncio.run(seed())
    # Nobody moves the fake clock here: an executor's lease must not wait for work (max_wait=0).
    executors = RemoteExecutors(driver, clock=clock, max_wait=0)
    return create_app(operations=operations, tokens=TOKENS, executors=executors)


# The event stream is left out: it runs until the client leaves (or ``max_events`` events came),
# which a generated request never does on a quiet store. tests/web/test_api_events.py covers it.
schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", _app()).exclude(path="/api/v1/events/stream")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_error_and_the_schema_holds(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=ADMIN, checks=CHECKS)
