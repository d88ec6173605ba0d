"""The README's quick start runs as printed, and its links point at files that exist (or are due)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.acceptance.support import REPO, environment

README = (REPO / "README.md").read_text(encoding="utf-8")


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_quick_start_runs_and_prints_what_the_readme_says() -> None:
    quick_start = _python_blocks()[0]
    assert "asyncio.run(main())" in quick_start
    done = subprocess.run(
        [sys.executable, "-c", quick_start],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True False", "{'sent_to': 'ada@example.com', 'attempt': 1}"]
    assert "`True False` and `{'sent_to': 'ada@example.com', 'attempt': 1}`" in README


def test_task_option_defaults_in_the_table_match_the_code() -> None:
    from mscheduler import TaskOption

    option = TaskOption()
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)`", README, flags=re.MULTILINE))
    assert rows["priority"] == str(option.priority)
    assert rows["concurrent_worker_cnt"] == str(option.concurrent_worker_cnt)
    assert rows["max_unexpected_retries"] == str(option.max_unexpected_retries)
    for name in ("ping_interval", "worker_timeout", "retry_delay"):
        assert rows[name] == f"{getattr(option, name).total_seconds():g} s", name


def test_local_links_exist() -> None:
    # guarantees.md and benchmarks/README.md are written alongside; the rest must exist now.
    for target in re.findall(r"\]\(([^)#:]+)\)", README):
        assert (REPO / target).exists() or target in {"docs/guarantees.md", "benchmarks/README.md"}, target


def test_consumer_defaults_in_the_table_match_the_code() -> None:
    import inspect
    from datetime import timedelta

    from mscheduler import Consumer

    defaults = {n: p.default for n, p in inspect.signature(Consumer.__init__).parameters.items()}
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)`", README, flags=re.MULTILINE))
    assert rows["concurrency"] == str(defaults["concurrency"])
    for name in (
        "poll_interval",
        "stream_poll_interval",
        "grace_period",
        "heartbeat_interval",
        "claim_lease",
    ):
        value = defaults[name]
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        assert rows[name] in (f"{seconds} s", f"{seconds:g} s"), (name, rows[name], seconds)
