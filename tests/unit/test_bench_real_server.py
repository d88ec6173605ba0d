"""The real-server benchmark (benchmarks/real_server.py, issue 18 C) runs end to end: on mongomock
here (the plumbing: every variant burns its tasks down, its client-side figures are reported and
the server-side counters mongomock cannot give are null with the reason); against the replica set
of MSCHEDULER_TEST_MONGODB_URI every counter is read (tests/real/test_real_server_bench.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks.real_server import cli


def test_every_variant_burns_down_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    cli(
        [
            "--mongomock",
            "--tasks",
            "40",
            "--consumers",
            "2",
            "--concurrency",
            "5",
            "--variants",
            "plain,limit+events",
        ]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["variant"] for r in lines] == ["plain", "limit+events"]
    for result in lines:
        assert result["tasks"] == 40 and result["tasks_per_s"] > 0
        assert result["claim_ms"]["claims"] > 0 and result["claim_ms"]["p50"] is not None
        assert result["commands_per_task"] > 1
        assert (
            result["write_conflicts_per_task"] is None and result["oplog_bytes_per_task"]["burn_down"] is None
        )
        assert result["unavailable"]
    assert lines[1]["limit_commands"]["acquire"] > 0
    assert "insert events" in lines[1]["by_operation"]


def test_unknown_variants_are_refused() -> None:
    with pytest.raises(SystemExit):
        cli(["--mongomock", "--variants", "plain,fast"])
