"""benchmarks.compare: a small real run on this checkout (every scenario a row) and its arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import compare

ROOT = Path(__file__).resolve().parents[2]


def table(printed: str, scenario: str) -> list[str]:
    """The printed lines of one scenario's table, its title line first."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{scenario} ("))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def test_one_build_every_scenario_has_a_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs.json"
    code = compare.main(["--build", f"root={ROOT}", "--rounds", "1", "--tasks", "200", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    record = json.loads(out.read_text(encoding="utf-8"))
    assert {run["scenario"] for run in record["runs"]} == set(compare.SCENARIOS)
    for scenario in compare.SCENARIOS:
        entry = record["summary"][scenario]
        row = entry["builds"]["root"]
        assert entry["reference"] == "root"
        assert row["runs"] == 1 and row["skipped"] is None and row["errors"] == [], row
        assert row["median"] > 0
        assert row["ratios"] == [1.0] and row["median_ratio"] == 1.0
        lines = table(printed, scenario)
        (printed_row,) = [line for line in lines if line.startswith("root ")]
        assert printed_row.split()[1:2] == ["1"] and " 1.000 " in printed_row
    run = record["runs"][0]
    assert Path(run["result"]["mscheduler_file"]).is_relative_to(ROOT)


def run(round_no: int, build: str, tasks_per_s: float | None, scenario: str = "burn_down") -> compare.Run:
    if tasks_per_s is None:
        return compare.Run(round_no, scenario, build, {"scenario": scenario, "skipped": "no such feature"})
    return compare.Run(round_no, scenario, build, {"scenario": scenario, "tasks_per_s": tasks_per_s})


def test_ratios_are_per_round_and_a_skipping_first_build_hands_over_the_reference() -> None:
    runs = [
        run(1, "a", 100.0),
        run(1, "b", 50.0),
        run(2, "a", 200.0),
        run(2, "b", 160.0),
        compare.Run(3, "burn_down", "a", error="timed out after 300 s"),
        run(3, "b", 90.0),
        run(1, "a", None, "burn_down_events"),
        run(1, "b", 30.0, "burn_down_events"),
    ]
    summary = compare.summarise(runs, ["burn_down", "burn_down_events"], ["a", "b"])
    b = summary["burn_down"]["builds"]["b"]
    assert b["ratios"] == [0.5, 0.8]  # round 3 has no figure for a: no ratio
    assert b["median_ratio"] == 0.65 and b["median"] == 90.0 and (b["min"], b["max"]) == (50.0, 160.0)
    assert summary["burn_down"]["builds"]["a"]["errors"] == ["round 3: timed out after 300 s"]
    events = summary["burn_down_events"]
    assert events["reference"] == "b" and events["builds"]["b"]["ratios"] == [1.0]
    assert events["builds"]["a"]["skipped"] == "no such feature"
    printed = compare.format_tables(summary, tasks=10)
    assert "a          skipped: no such feature" in printed
    assert "  a FAILED round 3: timed out after 300 s" in printed
