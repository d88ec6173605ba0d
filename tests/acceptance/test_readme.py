"""The README's quick start runs as printed, its tables match the code, and every relative link in
the README and ``docs/*.md`` points at a file and heading that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.acceptance.support import REPO, environment

README = (REPO / "README.md").read_text(encoding="utf-8")
FEATURES = (REPO / "docs" / "features.md").read_text(encoding="utf-8")
OPERATIONS = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")


def _python_blocks(page: str = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)


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
    assert done.stdout.splitlines() == [
        "True False",
        "{'sent_to': 'ada@example.com', 'attempt': 1}",
        "invoice-42.pdf",
    ]
    assert "`True False`, `{'sent_to': 'ada@example.com', 'attempt': 1}` and\n`invoice-42.pdf`" in README


def test_the_quick_start_tests_its_app_with_the_testing_kit(tmp_path: Path) -> None:
    """The quick start saved as shop.py, then its testing-kit block, next to it."""
    (tmp_path / "shop.py").write_text(_python_blocks()[0])
    block = _block_with("scheduler_kit(app)")
    assert "from shop import app, render_pdf" in block
    done = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_quick_start_ends_with_mscheduler_dev() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    shell = re.findall(r"```sh\n(.*?)```", quick, flags=re.DOTALL)
    assert shell and shell[-1].startswith("mscheduler dev shop:app")


def test_task_option_defaults_in_the_table_match_the_code() -> None:
    from mscheduler import TaskOption

    option = TaskOption()
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)`", README, flags=re.MULTILINE))
    assert rows["priority"] == str(option.priority)
    assert rows["concurrent_worker_cnt"] == str(option.concurrent_worker_cnt)
    assert rows["max_unexpected_retries"] == str(option.max_unexpected_retries)
    for name in ("ping_interval", "worker_timeout", "retry_delay"):
        assert rows[name] == f"{getattr(option, name).total_seconds():g} s", name


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation (backticks included) dropped, spaces
    turned into hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _without_fences(text: str) -> str:
    """The text outside fenced blocks: a ``#`` comment in a shell block is no heading."""
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def _without_code(text: str) -> str:
    """The text outside fenced blocks and inline code: ``x[0](y)`` in code is no link."""
    return re.sub(r"`[^`\n]*`", "", _without_fences(text))


def _anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (a repeated heading gets ``-1``, ``-2``, …)."""
    seen: dict[str, int] = {}
    anchors = set()
    text = _without_fences(path.read_text(encoding="utf-8"))
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        slug = _slug(heading)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` whose file does not exist, or whose ``#anchor`` names no
    heading of that file."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not ours to check offline
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def _documentation() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_relative_link_points_at_an_existing_file_and_heading() -> None:
    pages = _documentation()
    assert {"cli.md", "api.md", "dashboard.md", "operations.md", "features.md"} <= {p.name for p in pages}
    broken = {p.relative_to(REPO).as_posix(): _broken_links(p) for p in pages}
    assert {page: links for page, links in broken.items() if links} == {}


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# Other\n\n## Flow limits: rate and `concurrency`\n\n## Step\n\n## Step\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#flow-limits-rate-and-concurrency) [ok](other.md#step-1) [ok](#page)\n"
        "[gone](missing.md) [bad anchor](other.md#nothing) [bad here](#nowhere) [web](https://example.com)\n"
        "`[in code](missing-too.md)`\n\n```sh\n# not a heading\n```\n[not an anchor](#not-a-heading)\n"
    )
    assert _broken_links(page) == [
        "missing.md: no such file",
        "other.md#nothing: no heading with that anchor",
        "#nowhere: no heading with that anchor",
        "#not-a-heading: no heading with that anchor",
    ]


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
        if value is None:
            assert rows[name] == "None", (name, rows[name])
            continue
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        assert rows[name] in (f"{seconds} s", f"{seconds:g} s"), (name, rows[name], seconds)


def _block_with(text: str) -> str:
    (block,) = [b for b in _python_blocks() if text in b]
    return block


def _table_first_column(heading: str, page: str = README) -> set[str]:
    """The backticked first cells of the table after ``heading``'s paragraph(s) in ``page``."""
    section = page.split(heading, 1)[1]
    rows = re.findall(r"^\| `(\w+)` \|", section.split("\n## ", 1)[0], flags=re.MULTILINE)
    return set(rows)


def test_the_testing_example_runs_on_both_drivers() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _block_with("mongomock_database()")],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["both drivers ok"]


def test_the_error_message_example_is_what_the_code_says() -> None:
    import pytest

    from mscheduler import InvalidInput, TaskOption

    with pytest.raises(InvalidInput) as exc:
        TaskOption(priority=2_000_000)
    assert str(exc.value) in " ".join(README.split())


def test_every_listener_event_is_documented() -> None:
    sources = "\n".join(p.read_text() for p in (REPO / "mscheduler" / "runtime" / "consumer").glob("*.py"))
    emitted = set(re.findall(r"_emit\(\s*\"(\w+)\"", sources))
    emitted |= {"lost", "revoked"}  # emitted as _emit(reason, ...) by the lease checks
    assert "claimed" in emitted and "finished" in emitted
    assert _table_first_column("## Watching a consumer", OPERATIONS) == emitted


def test_task_context_fields_are_documented() -> None:
    import dataclasses

    from mscheduler import TaskContext

    fields = {f.name for f in dataclasses.fields(TaskContext) if not f.name.startswith("_")}
    assert _table_first_column("### Handlers and their context") >= fields


def test_flow_limits_example_runs() -> None:
    block = next(b for b in _python_blocks(FEATURES) if "set_limit" in b)
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=REPO, env=environment(), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["4 0"]


def test_the_flask_example_runs() -> None:
    block = _block_with("SyncPublisher(MemoryDriver())")
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=REPO, env=environment(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["{'created': True} {'created': False}"]
    assert "It prints `{'created': True} {'created': False}`" in README


INTERNAL = re.compile(
    r"\bSPEC\b|\bseed(?:'s)? ?\d{3}|\b[Ii]ssues? #?\d+|\b[FG]\d{1,2}\b(?![-.\w])|\bSTYLE \d+"
)


def test_the_readme_and_docs_speak_a_users_words() -> None:
    """No reference to the project's internal papers (the specification's feature ids, the
    design seeds, issue numbers): a user has none of them."""
    found = [
        f"{page.relative_to(REPO)}:{n}: {line.strip()}"
        for page in [*_documentation(), REPO / "CHANGELOG.md", REPO / "benchmarks" / "README.md"]
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if INTERNAL.search(line)
    ]
    assert not found, "\n".join(found)
