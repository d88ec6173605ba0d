"""benchmarks/api_load.py runs: a one-second load of this checkout's ``mscheduler web`` (200
tasks, 30 requests/s) gives figures for every kind of request and no error."""

from __future__ import annotations

from benchmarks.api_load import one_run


def test_a_short_load_of_this_checkout_gives_figures() -> None:
    result = one_run(None, seconds=1.5, tasks=200, rate=30)
    assert result["errors"] == {}
    assert result["requests"] > 10 and result["requests_per_s"] > 5
    assert {"tasks?limit=100", "stats", "lease"} <= set(result["per_kind"])
    assert 0 < result["server_cpu_share"] and result["p99_ms"] >= result["p50_ms"] > 0
    assert result["streams_opened"] >= 1
