"""Apps for the ``mscheduler dev`` / ``worker`` tests: ones that cannot run."""

from __future__ import annotations

from mscheduler import App

empty = App("empty")  # no handler: no consumer
not_an_app: dict[str, list[str]] = {"handlers": []}
