"""``mscheduler worker --metrics-port`` in a subprocess: Prometheus scrapes ``/metrics``."""

from __future__ import annotations

import re
import signal
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.support import Running, command

APP = "tests.acceptance.worker_app"


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_worker_serves_metrics_while_it_runs() -> None:
    args = [*command(), "worker", f"{APP}:factory", "--metrics-port", "0"]
    proc = Running(args, ACC_QUICK="5")
    try:
        proc.wait_for(r"metrics on http://0\.0\.0\.0:\d+/metrics")
        proc.wait_for(r"^processed quick-\d on acc-worker-\d$", count=5)
        match = re.search(r"metrics on http://0\.0\.0\.0:(\d+)/metrics", proc.output)
        assert match is not None
        finished = ("mscheduler_attempts_finished_total", (("name", "acc.quick"), ("outcome", "succeeded")))
        deadline = time.monotonic() + 10
        while True:  # a handler prints before its outcome is written: scrape until all 5 are
            found = scrape(int(match[1]))
            if found.get(finished) == 5 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        proc.signal(signal.SIGTERM)
        code = proc.finish(timeout=10)
    finally:
        proc.kill()
    assert code == 0, proc.output
    assert found.get(finished) == 5, found
    assert found[("mscheduler_store_up", ())] == 1
    assert found[("mscheduler_tasks", (("name", "acc.quick"), ("status", "pending")))] == 0
    assert found[("mscheduler_workers_live", ())] == 2


def test_a_busy_metrics_port_is_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = Running([*command(), "worker", f"{APP}:factory", "--metrics-port", str(port)])
        try:
            code = proc.finish(timeout=20)
        finally:
            proc.kill()
    assert code == 1, proc.output
    assert f"error: cannot serve metrics on port {port}" in proc.output
    assert "Traceback" not in proc.output
