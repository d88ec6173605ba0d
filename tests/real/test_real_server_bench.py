"""benchmarks/real_server.py against the replica set of MSCHEDULER_TEST_MONGODB_URI (issue 18 C): a
small run of two variants reads every server-side counter (serverStatus, the oplog, the indexes'
WiredTiger statistics); the figures themselves are the benchmark's, not this test's."""

from __future__ import annotations

import json

import pytest

from benchmarks.real_server import cli
from tests.conftest import REAL_URI

pytestmark = [
    pytest.mark.real_mongo,
    pytest.mark.skipif(not REAL_URI, reason="MSCHEDULER_TEST_MONGODB_URI is not set (needs a replica set)"),
]


def test_the_real_server_benchmark_reads_every_counter(capsys: pytest.CaptureFixture[str]) -> None:
    assert REAL_URI
    cli(["--mongodb-uri", REAL_URI, "--tasks", "300", "--consumers", "2", "--variants", "plain,limit+events"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["variant"] for r in lines] == ["plain", "limit+events"]
    for result in lines:
        assert result["unavailable"] is None, result["unavailable"]
        assert result["oplog_bytes_per_task"]["publish"] > 0
        assert result["oplog_bytes_per_task"]["burn_down"] > 0
        assert result["write_conflicts_per_task"] is not None
        assert result["index_keys_per_task"]["tasks"] is not None
        assert result["claim_ms"]["p99"] is not None
    # the limit's slots and the events add to what the burn-down writes
    assert lines[1]["oplog_bytes_per_task"]["burn_down"] > lines[0]["oplog_bytes_per_task"]["burn_down"]
