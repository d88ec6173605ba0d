"""mscheduler's pytest plugin (entry point ``pytest11``; loaded wherever mscheduler is installed):
fixtures for testing an app's tasks (docs/testing.md). Each name starts with ``mscheduler_`` so
that it never shadows a fixture of yours.

* ``mscheduler_clock``: a ``FakeClock`` (time moves only when told).
* ``mscheduler_kit``: makes a ``SchedulerKit`` on that clock — ``mscheduler_kit(app)`` (store,
  publisher and consumers wired on one clock; ``async with`` runs them), ``store="mongomock"``
  for ``MongoDriver``'s queries, ``eager=True`` for sends that run their task to the end.
* ``mscheduler_run_handler``: ``run_handler``, to call a handler once with a real context.

It imports nothing of mscheduler until a fixture is used, so loading it costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def mscheduler_clock() -> Any:
    """A ``FakeClock`` starting at 2030-01-01 00:00 UTC."""
    from mscheduler.testing.clock import FakeClock

    return FakeClock()


@pytest.fixture
def mscheduler_kit(mscheduler_clock: Any) -> Callable[..., Any]:
    """``mscheduler_kit(app, **options)``: a ``SchedulerKit`` on ``mscheduler_clock``."""
    from mscheduler.testing.kit import scheduler_kit

    def make(app: Any, **options: Any) -> Any:
        options.setdefault("clock", mscheduler_clock)
        return scheduler_kit(app, **options)

    return make


@pytest.fixture
def mscheduler_run_handler() -> Callable[..., Any]:
    """``await mscheduler_run_handler(handler, params, ...)``: see ``mscheduler.testing.run_handler``."""
    from mscheduler.testing.handler import run_handler

    return run_handler
