"""The same outcome, whoever reports it: a Python handler's return / raise and a remote executor's
report over HTTP are turned into the same stored attempt by the one set of rules
(``mscheduler.domain.outcomes``): status, retry time, finality, error type and the task's status."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from mscheduler import Consumer, FakeClock, MemoryDriver, Operations, Publisher, Task, TaskOption
from mscheduler.domain.exceptions import Fail, Retry, Snooze
from mscheduler.domain.retry import FixedRetry
from mscheduler.web import ApiTokens, create_app
from tests.scenarios.harness import advance_until

TOKEN = "executor-token-0123456789abcdef"
OPTION = TaskOption(retry=FixedRetry(delay=timedelta(seconds=7), max_retries=2))
NO_BUDGET = TaskOption(max_unexpected_retries=0)

# key -> (option, what the Python handler does, what the executor reports)
CASES: dict[str, tuple[TaskOption, Any, dict[str, Any]]] = {
    "ok": (OPTION, {"n": 1}, {"outcome": "succeeded", "result": {"n": 1}}),
    "plain": (OPTION, RuntimeError("disk"), {"outcome": "failed", "error": {"type": "RuntimeError"}}),
    "budget": (NO_BUDGET, RuntimeError("disk"), {"outcome": "failed", "error": {"type": "RuntimeError"}}),
    "retry": (OPTION, Retry(12), {"outcome": "failed", "retry_after": 12}),
    "fail": (OPTION, Fail("bad"), {"outcome": "failed", "final": True}),
    "snooze": (OPTION, Snooze(5), {"outcome": "snoozed", "retry_after": 5}),
    "big": (OPTION, "x" * 600_000, {"outcome": "succeeded", "result": "x" * 600_000}),
}


def summary(info: Any) -> tuple[Any, ...]:
    entry = info.worker_states[0]
    delay = (entry.retry_at - entry.end_time).total_seconds() if entry.retry_at else None
    return (
        info.status.value,
        entry.status.value,
        delay,
        entry.final,
        entry.error.type if entry.error else None,
    )


async def by_consumer() -> dict[str, tuple[Any, ...]]:
    clock = FakeClock()
    driver = MemoryDriver(clock=clock)
    consumer = Consumer(driver, worker_id="py", clock=clock, concurrency=len(CASES), planner=False)

    async def handle(params: Any, ctx: Any) -> Any:
        behaviour = CASES[ctx.key][1]
        if isinstance(behaviour, BaseException):
            raise behaviour
        return behaviour

    consumer.register("job", handle)
    await Publisher(driver, clock=clock).send_many(
        [Task(k, "job", None, option=o) for k, (o, _, _) in CASES.items()]
    )
    operations = Operations(driver, clock=clock)
    async with consumer:

        async def ended() -> bool:
            infos = await operations.get_tasks(list(CASES))
            return all(
                i.worker_states and i.worker_states[0].status.value != "running" for i in infos.values()
            )

        await advance_until(clock, ended, step=0.1, limit=10)
    return {k: summary(i) for k, i in (await operations.get_tasks(list(CASES))).items()}


async def by_executor() -> dict[str, tuple[Any, ...]]:
    clock = FakeClock()
    driver = MemoryDriver(clock=clock)
    await Publisher(driver, clock=clock).send_many(
        [Task(k, "job", None, option=o) for k, (o, _, _) in CASES.items()]
    )
    operations = Operations(driver, clock=clock)
    app = create_app(operations=operations, tokens=ApiTokens(executor=[TOKEN]))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        body = {"worker_id": "ex", "names": ["job"], "max_tasks": len(CASES)}
        leased = (await http.post("/api/v1/executors/lease", json=body, headers=headers)).json()["tasks"]
        for task in leased:
            report = {"worker_id": "ex", "key": task["key"], "attempt": task["attempt"]} | CASES[task["key"]][
                2
            ]
            answer = await http.post("/api/v1/executors/report", json=report, headers=headers)
            assert answer.status_code == 200, answer.text
    return {k: summary(i) for k, i in (await operations.get_tasks(list(CASES))).items()}


async def test_a_report_over_http_is_stored_as_a_python_handlers_outcome() -> None:
    python, remote = await by_consumer(), await by_executor()
    assert python == remote
    assert python == {
        "ok": ("succeeded", "succeeded", None, False, None),
        "plain": ("pending", "failed", 7.0, False, "RuntimeError"),
        "budget": ("failed", "failed", 0.0, False, "RuntimeError"),
        "retry": ("pending", "failed", 12.0, False, "Retry"),
        "fail": ("failed", "failed", None, True, "Fail"),
        "snooze": ("pending", "snoozed", 5.0, False, "Snooze"),
        "big": ("failed", "rejected", None, False, "ResultTooLarge"),
    }
