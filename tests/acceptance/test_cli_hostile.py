"""Stored text in the operator's terminal (issue 20, item 10): keys, worker ids, hosts, errors and
plan ids are chosen by whoever publishes or executes tasks. Every command that shows them prints
them as typed — never as Rich markup (``[/]`` crashed ``workers ls``; ``[link=...]`` made a
clickable link) — with control characters replaced by visible stand-ins (an error holding
``\\x1b[2J`` reached the terminal raw)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from mscheduler import Consumer, MemoryDriver, Operations, Publisher, Task, TaskOption, TaskStatus
from mscheduler.cli import common as cli_ops
from mscheduler.domain.plans import Plan
from mscheduler.domain.schedule import EverySchedule, PlanTiming
from mscheduler.drivers.base import InsertParams, NewTask, WorkerInfo
from tests.acceptance.support import cli

LINK_KEY = "[link=http://evil.example/x]invoice-42[/link]"
MARKUP_WORKER = "[/]"
CLEAR = "\x1b[2J"
ERROR = f"boom {CLEAR}\x1b]8;;http://evil.example\x1b\\\\click\x1b]8;;\x1b\\\\ [bold]loud[/bold]"


async def _seed(driver: MemoryDriver) -> None:
    publisher = Publisher(driver)
    await publisher.send(Task("bad-1", "boom", {"note": CLEAR}, option=TaskOption(max_unexpected_retries=0)))
    # a key with '/' is no longer sent (a child's): written below the rules, as a store of
    # another build could hold it; the CLI must show it as typed all the same
    now = datetime.now(UTC)
    linked = NewTask(LINK_KEY, "job", {}, TaskOption().to_storage(now))
    assert await driver.insert_tasks(InsertParams([linked], now)) == [True]
    consumer = Consumer(driver, worker_id=MARKUP_WORKER, concurrency=1, poll_interval=0.01)

    async def boom(params: object) -> None:
        raise RuntimeError(ERROR)

    consumer.register("boom", boom)
    async with consumer:
        for _ in range(500):
            if (await Operations(driver).get_task("bad-1")).status is TaskStatus.FAILED:
                break
            await asyncio.sleep(0.01)
    now = datetime.now(UTC)
    await driver.register_worker(WorkerInfo("[red]w[/red]", f"host{CLEAR}", 7, ("job",), 2, now))
    timing = PlanTiming(schedule=EverySchedule(interval=3600, start=now))
    await Operations(driver).add_plan(Plan(plan_id="[b]plan[/b]", name="job", timing=timing))


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryDriver]:
    driver = MemoryDriver(events=True)
    asyncio.run(_seed(driver))
    monkeypatch.setattr(cli_ops, "operations_override", lambda: Operations(driver))
    yield driver


def _shown(*args: str) -> str:
    code, out, err = cli(*args)
    assert code == 0, (args, err)
    assert "\x1b" not in out and "\x1b" not in err, args  # no escape sequence of a stored value
    return out


def test_markup_in_stored_text_is_shown_as_typed(store: MemoryDriver) -> None:
    workers = _shown("workers", "ls")
    assert MARKUP_WORKER in workers and "[red]w[/red]" in workers  # no MarkupError, no colour
    assert "host␛[2J" in workers
    tasks = _shown("tasks", "ls")
    assert LINK_KEY in tasks  # the markup's text itself: no link was made of it
    assert "␛[2J" in tasks  # the last error's control characters, made visible
    assert "[bold]loud[/bold]" in tasks
    shown = _shown("tasks", "show", "bad-1")
    assert MARKUP_WORKER in shown and "␛]8;;http://evil.example" in shown
    assert LINK_KEY in _shown("tasks", "show", LINK_KEY)
    assert "[b]plan[/b]" in _shown("plans", "ls")
    events = _shown("events", "ls", "--key", "bad-1")
    assert MARKUP_WORKER in events


def test_refusals_naming_stored_text_are_plain_too(store: MemoryDriver) -> None:
    code, _, err = cli("tasks", "show", "nope[/]")
    assert code == 1 and "[/]" in err  # markup shown as typed
    code, _, err = cli("tasks", "show", f"nope{CLEAR}")
    assert code == 2 and "\x1b" not in err and "control characters" in err  # no key holds one


def test_plain_text_keeps_lengths_tabs_and_new_lines() -> None:
    from mscheduler.observability.logs import plain_text

    text = "a\tb\nc\x1b[2J\r\x7f\x9b\u202e"
    shown = plain_text(text)
    assert shown == "a\tb\nc␛[2J␍␡\ufffd\ufffd" and len(shown) == len(text)


def test_a_workers_text_log_shows_control_characters_made_visible() -> None:
    import logging

    from mscheduler.observability.logs import TextFormatter

    record = logging.LogRecord(
        "mscheduler.consumer", logging.WARNING, __file__, 1, "failed: %s", (ERROR,), None
    )
    line = TextFormatter().format(record)
    assert "\x1b" not in line and "failed: boom ␛[2J" in line
