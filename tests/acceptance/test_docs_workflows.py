"""The workflow examples of docs/features.md run as written and print what their comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.acceptance.support import printed_comments, run_python

REPO = Path(__file__).resolve().parents[2]
FEATURES = (REPO / "docs" / "features.md").read_text(encoding="utf-8")
SECTION = FEATURES.split("## Workflows", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, flags=re.DOTALL)


def test_the_section_has_a_chain_a_dag_and_a_map_with_a_join() -> None:
    assert len(BLOCKS) == 3
    assert 'needs=["fetch"]' in BLOCKS[0]
    assert 'needs=["price", "stock"]' in BLOCKS[1]
    assert "map_over=" in BLOCKS[2] and 'needs=["resize"]' in BLOCKS[2]


@pytest.mark.parametrize("index", range(3), ids=["chain", "dag", "map-join"])
def test_each_workflow_example_prints_what_it_says(index: int) -> None:
    block = BLOCKS[index]
    assert run_python(block, timeout=120) == printed_comments(block)
