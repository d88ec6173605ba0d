"""Handlers for the process-pool tests: module level, so that a spawned process imports them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mscheduler import Retry


class Numbers(BaseModel):
    n: int
    marker: str = ""


def crunch(params: Numbers, ctx: Any) -> dict[str, Any]:
    """CPU-bound work in a process: reports progress and a checkpoint, returns what it computed."""
    ctx.progress(0.5, "half way")
    ctx.checkpoint({"done": params.n})
    return {"sum": sum(range(params.n)), "attempt_no": ctx.attempt_no}


def retry_once(params: dict[str, Any]) -> str:
    raise Retry(60, "not ready in a process")


def until_cancelled(params: dict[str, Any], ctx: Any) -> str:
    """Polls ctx.cancelled (a process cannot be stopped from outside), then says it saw it."""
    started = Path(params["marker"] + ".started")
    started.write_text("running")
    deadline = time.monotonic() + 60
    while not ctx.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    Path(params["marker"]).write_text("cancelled" if ctx.cancelled else "timed out")
    return "ignored"


class Scaler:
    """A callable object, pickled into the process with its state."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, params: dict[str, int]) -> int:
        return params["n"] * self.factor
