"""The fairness and aging examples of docs/features.md run as written and print what their
comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.acceptance.support import printed_comments, run_python

REPO = Path(__file__).resolve().parents[2]
FEATURES = (REPO / "docs" / "features.md").read_text(encoding="utf-8")


def _block(heading: str) -> str:
    section = FEATURES.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return block


@pytest.mark.parametrize(
    ("heading", "needle"),
    [("Fairness between keys", "fair_key=tenant"), ("Priorities that age", "aging=step")],
)
def test_the_example_prints_what_it_says(heading: str, needle: str) -> None:
    block = _block(heading)
    assert needle in block
    expected = printed_comments(block)
    assert expected
    assert run_python(block, timeout=120) == expected
