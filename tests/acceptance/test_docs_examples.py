"""Examples of ``docs/*.md`` that no other test runs (docs/testing.md's run as one test module:
``tests/unit/test_testing_kit.py``): each runs as written and prints what the page says."""

from __future__ import annotations

import re

from tests.acceptance.support import REPO, run_python


def block_under(page: str, heading: str) -> str:
    """The first Python block of ``docs/<page>`` under ``## heading``."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[0]


def test_an_apps_plans_in_a_plain_script() -> None:
    lines = run_python(block_under("plans.md", "An app's plans in a plain script"))
    assert lines == ["['report']", "a run succeeded"]
