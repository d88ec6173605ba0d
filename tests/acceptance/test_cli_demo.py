"""``mscheduler demo`` end to end, in a subprocess: exit code and the printed summary."""

from __future__ import annotations

import re
import sys

from tests.acceptance.support import QUICK_RUN, command, run

TOTAL = 53  # 40 quick + 6 flaky + 1 doomed + 1 long + 4 targeted + 1 fan-out (DemoConfig defaults)


def test_demo_exits_0_and_prints_the_expected_summary() -> None:
    code, out, err, seconds = run([*command(), "demo"])
    assert code == 0, f"exit {code}\n{out}\n{err}"
    # the progress bar counts what the tables count (the plans' runs are a check of their own)
    assert re.search(rf"^tasks .* {TOTAL}/{TOTAL} failed 1 succeeded 52 ", out, re.M), out
    assert re.search(r"succeeded\W+52\W+52\b", out), out  # state, tasks, expected
    assert re.search(r"failed\W+1\W+1\b", out), out
    assert re.search(rf"total\W+{TOTAL}\W+{TOTAL}\b", out), out
    assert f"{TOTAL}/{TOTAL} tasks reached their expected end state" in out
    # Every path ran: retries (1 or 2 failures for each of 6 flaky tasks), the retry budget, pings.
    assert re.search(r"retries\W+OK\W+9 failed attempts retried", out), out
    assert re.search(r"retry budget\W+OK\W+doomed-000 failed for good after 3 attempts", out), out
    assert re.search(r"pings\W+OK\W+long-000 ran \d\.\ds on one lease; ping_expire_time moved \+", out), out
    assert re.search(r"targeting\W+OK\W+4 tasks ran only on demo-worker-2", out), out
    assert re.search(r"fan-out\W+OK\W+fanout-000 ran once on each of", out), out
    for worker in range(1, 5):
        assert re.search(rf"demo-worker-{worker}\W+\d+\W+\d+", out), out  # per-worker row
    assert re.search(r"\d+ tasks ended in [\d.]+s: [\d.]+ tasks/s", out), out
    assert "demo OK" in out
    # the doomed task fails on purpose: one line that says so, no traceback
    assert "Traceback" not in out + err
    assert (
        "task doomed-000 (demo.work) failed for good on attempt 3, as the demo intends: DemoFailure"
        in out + err
    )
    assert seconds < QUICK_RUN, f"the demo took {seconds:.1f}s"


def test_demo_exits_nonzero_when_tasks_do_not_reach_their_end_state() -> None:
    # The long task alone runs 1.6 s, so a 1 s deadline cannot be met.
    code, out, err, _ = run([sys.executable, "-m", "mscheduler", "demo", "--timeout", "1", "--quick", "5"])
    assert code == 1, f"exit {code}\n{out}\n{err}"
    assert re.search(r"end states\W+FAIL\W+\d+/18 tasks reached their expected end state \(timed out", out), (
        out
    )
    assert "demo FAILED" in out


def test_demo_on_unreachable_mongodb_fails_fast() -> None:
    uri = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300"
    code, out, err, seconds = run([*command(), "demo", "--mongodb-uri", uri])
    assert code == 1, f"exit {code}\n{out}\n{err}"
    assert "cannot reach MongoDB at mongodb://127.0.0.1:1/" in err
    assert "Traceback" not in out + err
    assert seconds < QUICK_RUN
