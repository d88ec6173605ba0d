"""``mscheduler stats``: how ``TaskStats`` prints (Rich tables) and its progress line; the numbers
come from ``Operations.stats`` and nothing is computed here but their formatting.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer
from rich.console import Console, RenderableType
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from mscheduler.cli.common import Connection, JsonOpt, Ops, app, connected, err, out, print_json, run
from mscheduler.domain.stats import TaskStats

SPARKS = "▁▂▃▄▅▆▇█"


def _percent(rate: float | None) -> str:
    return "" if rate is None else f"{rate * 100:.1f}%"


def _seconds(value: float | None) -> str:
    """A duration for people: 850ms, 12.5s, 4m10s, 3h05m."""
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def sparkline(values: list[int]) -> str:
    top = max(values, default=0)
    if top == 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(len(SPARKS) - 1, v * len(SPARKS) // (top + 1))] for v in values)


async def stats_with_progress(
    ops: Ops, window: timedelta, names: list[str] | None, console: Console, show: bool
) -> TaskStats:
    """``Operations.stats`` with, when ``show``, a transient line on ``console`` (stderr) naming
    the read in progress and the time spent: the store's aggregations report nothing while they
    run, so their phases are the progress there is to show (a large store takes seconds)."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not show) as progress:
        line = progress.add_task("statistics", total=None)

        def on_step(what: str) -> None:
            progress.update(line, description=what)

        return await ops.stats(window=window, names=names, on_step=on_step)


def stats_renderables(stats: TaskStats) -> list[RenderableType]:
    """The counts table, the per-name table and the summary lines."""
    counts = Table(title="tasks by status")
    counts.add_column("status")
    counts.add_column("count", justify="right")
    for status, count in stats.counts.items():
        counts.add_row(status, str(count))
    counts.add_row(Text("total", style="bold"), Text(str(stats.total), style="bold"))
    shown: list[RenderableType] = [counts]
    if stats.names:
        window = f"{(stats.window_seconds or 0) / 60:g} min"
        names = Table(title=f"by name (rates and durations: tasks finished in the last {window})")
        for column in ("name", "pending", "running", "done", "failed", "1st try", "2nd try", "p50", "p95"):
            names.add_column(column, justify="left" if column == "name" else "right")
        names.add_column("oldest due", justify="right")
        for n in stats.names:
            names.add_row(
                n.name,
                str(n.counts.get("pending", 0)),
                str(n.counts.get("running", 0)),
                str(n.counts.get("succeeded", 0)),
                str(n.counts.get("failed", 0)),
                _percent(n.first_attempt_success_rate),
                _percent(n.second_attempt_success_rate),
                _seconds(n.duration_p50),
                _seconds(n.duration_p95),
                _seconds(n.oldest_pending_age),
            )
        shown.append(names)
    summary = Text()
    if stats.window_seconds is not None:
        summary.append(
            f"last {stats.window_seconds / 60:g} min: {stats.finished} finished "
            f"({stats.succeeded} succeeded, {stats.failed} failed)"
        )
        if stats.finished:
            summary.append(
                f"; first-attempt success {_percent(stats.first_attempt_success_rate)}, "
                f"second-attempt {_percent(stats.second_attempt_success_rate)}"
            )
        summary.append("\n")
    oldest = _seconds(stats.oldest_pending_age) or "none"
    summary.append(f"oldest due pending task waiting: {oldest}\n")
    if stats.throughput:
        per_minute = [b.succeeded + b.failed for b in stats.throughput]
        peak = max(range(len(per_minute)), key=per_minute.__getitem__)
        summary.append(
            f"throughput, last hour: {sum(per_minute)} tasks, {sum(per_minute) / len(per_minute):.1f}/min, "
            f"peak {per_minute[peak]}/min at {stats.throughput[peak].start:%H:%M} UTC\n"
        )
        summary.append(sparkline(per_minute))
    shown.append(summary)
    return shown


@connected
def stats(
    conn: Connection,
    as_json: JsonOpt = False,
    window: Annotated[
        int, typer.Option(metavar="MINUTES", help="Window of rates and durations (1-10080).")
    ] = 60,
    name: Annotated[list[str] | None, typer.Option(metavar="NAME", help="Only this task name.")] = None,
    by_key: Annotated[
        bool, typer.Option("--by-key", help="Per fairness key instead: due tasks and the oldest's wait.")
    ] = False,
) -> None:
    """Task statistics: counts by status and name, first- and second-attempt success rates,
    duration p50 / p95, the oldest due pending task, throughput over the last hour. While the
    store computes them, a line on stderr (a terminal only) names the phase and the time spent.
    --by-key: the fairness keys with due tasks instead, the longest wait first (at most 100)."""
    if by_key:
        _key_waits(conn, name or None, as_json)
        return
    show = not as_json and err.is_terminal
    result = run(
        conn, lambda ops: stats_with_progress(ops, timedelta(minutes=window), name or None, err, show)
    )
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    for shown in stats_renderables(result):
        out.print(shown)


def _key_waits(conn: Connection, names: list[str] | None, as_json: bool) -> None:
    waits = run(conn, lambda ops: ops.key_waits(names=names))
    if as_json:
        print_json([w.model_dump(mode="json") for w in waits])
        return
    table = Table(title="due tasks by fairness key (the longest wait first)")
    for column in ("key", "due", "oldest due"):
        table.add_column(column, justify="left" if column == "key" else "right")
    for wait in waits:
        table.add_row(wait.key, str(wait.due), _seconds(wait.oldest_wait))
    out.print(table if waits else "no due task has a fairness key")


app.command(short_help="Task statistics: counts, success rates, durations.")(stats)
