"""``mscheduler dev APP`` in a subprocess, as a newcomer runs it from a fresh clone with no
MongoDB: the example shop's handlers run, tasks go in over HTTP (``POST /api/v1/tasks``) and the
CLI reads them back over the API, the dashboard is served, Ctrl-C stops it cleanly, ``--data``
keeps the store across restarts; and the bad input it refuses in one line. ``worker`` takes the
same App against MongoDB. Loopback only."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.support import QUICK_RUN, Running, command, run

APP = "examples.shop:app"
TOKEN = "dev-test-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
# The example's plan makes a task at each full minute of the wall clock: a test that crosses one
# sees it, so lists are split into the plan's tasks and the rest.
PLANNED = "plan:price-report-every-minute:"


def sent_only(keys: dict[str, Any]) -> dict[str, Any]:
    """``keys`` without the plan's tasks, after checking every other key is one of them."""
    planned = {key for key in keys if key.startswith(PLANNED)}
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:00\.000Z", k[len(PLANNED) :]) for k in planned)
    return {key: value for key, value in keys.items() if key not in planned}


def start(*extra: str) -> tuple[Running, str]:
    proc = Running([*command(), "dev", APP, "--port", "0", "--token", TOKEN, *extra])
    proc.wait_for(r"^Ctrl\+C to stop", timeout=30)
    url = re.search(r"REST API +(http://127\.0\.0\.1:\d+)/api/v1", proc.output)
    assert url is not None, proc.output
    return proc, url.group(1)


def stop(proc: Running) -> int:
    proc.signal(signal.SIGINT)
    return proc.finish(timeout=20)


def ended(url: str, key: str, timeout: float = 30) -> dict[str, Any]:
    """The task once it ended (a real server: its answer is awaited, with a bound)."""
    deadline = time.monotonic() + timeout
    while True:
        info = httpx.get(f"{url}/api/v1/tasks/{key}", headers=HEADERS).json()
        if info.get("status") in ("succeeded", "failed") or time.monotonic() > deadline:
            return dict(info)
        time.sleep(0.05)


def test_dev_runs_the_app_with_the_api_the_cli_and_the_dashboard() -> None:
    proc, url = start()
    try:
        assert f"token      {TOKEN}" in proc.output
        one = {"key": "invoice-1", "name": "send_invoice", "params": {"order_id": 1, "email": "a@b.c"}}
        answer = httpx.post(f"{url}/api/v1/tasks", json=one, headers=HEADERS)
        assert (answer.status_code, answer.json()) == (201, {"key": "invoice-1", "created": True})
        batch = {
            "tasks": [
                {"key": "receipt-1", "name": "render_receipt", "params": {"order_id": 1, "lines": 2}},
                {"key": "report-1", "name": "price_report", "params": {"n": 1000}},
                {"key": "charge-1", "name": "charge_card", "params": {}},
            ]
        }
        assert httpx.post(f"{url}/api/v1/tasks", json=batch, headers=HEADERS).status_code == 201
        assert ended(url, "invoice-1")["status"] == "succeeded"
        receipt = ended(url, "receipt-1")  # a plain function, in a thread
        assert receipt["status"] == "succeeded" and receipt["worker_states"][0]["result"] == "receipt-1.pdf"
        assert ended(url, "report-1")["status"] == "succeeded"  # in a process
        charged = ended(url, "charge-1")  # retried after its Retry(after=2)
        assert charged["status"] == "succeeded" and len(charged["worker_states"]) == 2

        code, out, err, _ = run([*command(), "tasks", "ls", "--api-url", url, "--token", TOKEN, "--json"])
        assert code == 0, err
        listed = {t["key"]: t["status"] for t in json.loads(out)}
        sent = ["invoice-1", "receipt-1", "report-1", "charge-1"]
        assert sent_only(listed) == dict.fromkeys(sent, "succeeded")
        code, out, err, _ = run([*command(), "plans", "ls", "--api-url", url, "--token", TOKEN])
        assert code == 0 and "price-report-every-minute" in out, err

        page = httpx.get(f"{url}/ui/")
        assert page.status_code == 200 and "<title>" in page.text
        assert (
            httpx.get(
                f"{url}/api/v1/tasks", headers={"Authorization": "Bearer wrong-token-123456"}
            ).status_code
            == 401
        )
    finally:
        code = stop(proc)
        proc.kill()
    assert code == 0, proc.output
    assert proc.output.rstrip().endswith("mscheduler dev: stopped")
    assert "Traceback" not in proc.output


def test_a_token_is_made_when_none_is_given() -> None:
    proc = Running([*command(), "dev", APP, "--port", "0"])
    try:
        proc.wait_for(r"^Ctrl\+C to stop", timeout=30)
        token = re.search(r"token +(\S{20,})", proc.output)
        url = re.search(r"REST API +(http://127\.0\.0\.1:\d+)", proc.output)
        assert token and url
        # the CLI is shown taking the token from the environment: a command line's arguments
        # are in every process list
        tried = re.search(r"^ +try +(.*)$", proc.output, re.MULTILINE)
        assert tried is not None and "--token" not in tried.group(1)
        assert f"export MSCHEDULER_TOKEN={token.group(1)}" in tried.group(1)
        whoami = httpx.get(
            f"{url.group(1)}/api/v1/whoami", headers={"Authorization": f"Bearer {token.group(1)}"}
        )
        assert whoami.json()["role"] == "admin"
    finally:
        assert stop(proc) == 0
        proc.kill()


def test_data_keeps_the_store_across_restarts(tmp_path: Path) -> None:
    data = tmp_path / "store.json"
    proc, url = start("--data", str(data))
    try:
        one = {"key": "kept-1", "name": "send_invoice", "params": {"order_id": 7, "email": "k@e.pt"}}
        assert httpx.post(f"{url}/api/v1/tasks", json=one, headers=HEADERS).status_code == 201
        assert ended(url, "kept-1")["status"] == "succeeded"
    finally:
        assert stop(proc) == 0, proc.output
        proc.kill()
    assert f"saved the store to {data}" in proc.output and data.exists()

    again, url = start("--data", str(data))
    try:
        loaded = re.search(r"\((\d+) task\(s\) loaded\)", again.output)
        assert loaded is not None, again.output
        listed = httpx.get(f"{url}/api/v1/tasks", headers=HEADERS).json()["tasks"]
        keys = {task["key"]: task["status"] for task in listed}
        assert sent_only(keys) == {"kept-1": "succeeded"} and int(loaded.group(1)) <= len(keys)
        info = httpx.get(f"{url}/api/v1/tasks/kept-1", headers=HEADERS).json()
        assert info["status"] == "succeeded" and info["worker_states"][0]["result"]["order_id"] == 7
    finally:
        assert stop(again) == 0
        again.kill()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["no_such_module:app"], "cannot import module 'no_such_module'"),
        (["tests.acceptance.dev_broken:app"], "RuntimeError: the app's settings are missing"),
        (["tests.acceptance.dev_apps:nope"], "has no attribute 'nope'"),
        (["tests.acceptance.dev_apps:not_an_app"], "is a dict, not an mscheduler.App"),
        (["tests.acceptance.dev_apps:empty"], "defines no consumer"),
        ([APP, "--token", "short"], "--token: admin token #1: must be a string of 16 to 512 characters"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    code, out, err, _ = run([*command(), "dev", *args, "--port", "0"])
    assert code == 2, out + err
    assert says in err and err.count("\n") == 1 and err.startswith("error: ")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("my notes", "is not a snapshot"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # was: a RecursionError traceback, exit 1
        (
            '{"format": "mscheduler-memory-snapshot", "version": 1, "tasks": [{"key": "k", "name": "job", '
            '"params": {"$code": "x"}}], "plans": [], "limits": [], "events": []}',
            "a Code, which the store never writes",  # was: loaded silently
        ),
    ],
    ids=["notes", "deep", "bson-code"],
)
def test_a_file_that_is_not_a_snapshot_is_exit_2(tmp_path: Path, content: str, says: str) -> None:
    data = tmp_path / "notes.json"
    data.write_text(content)
    code, _, err, _ = run([*command(), "dev", APP, "--port", "0", "--data", str(data)])
    assert code == 2 and "--data:" in err and says in err, err
    assert err.count("\n") == 1 and err.startswith("error: ")  # one line
    assert data.read_text() == content  # left as it was


def test_a_taken_port_is_exit_1() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err, _ = run([*command(), "dev", APP, "--port", str(port)])
    assert code == 1 and f"cannot listen on 127.0.0.1:{port}" in err, err


# -- the same App under `mscheduler worker` (MongoDB) ------------------------------------------------


def test_worker_asks_for_a_store_for_an_app() -> None:
    code, _, err, _ = run([*command(), "worker", APP])
    assert code == 2, err
    assert "examples.shop:app is an App: give its store with --mongodb-uri URI" in err


def test_worker_runs_an_app_against_mongodb_and_fails_fast_without_one(refused_port: int) -> None:
    uri = f"mongodb://127.0.0.1:{refused_port}/"
    code, _, err, seconds = run(
        [*command(), "worker", APP, "--mongodb-uri", uri, "--server-selection-timeout-ms", "300"]
    )
    assert code == 1, err
    assert f"cannot reach MongoDB at {uri}" in err and seconds < QUICK_RUN


def test_worker_refuses_a_store_for_a_target_that_builds_its_own() -> None:
    code, _, err, _ = run(
        [*command(), "worker", "tests.acceptance.worker_app:factory", "--mongodb-uri", "mongodb://x/"]
    )
    assert code == 2 and "builds its own store" in err, err


def test_the_socket_listens_before_the_banner_is_printed() -> None:
    """The banner (``Ctrl+C to stop``, the URLs) is printed before the server's first loop
    turn; a client that connects as soon as it reads it is queued, not refused (on a loaded
    machine the server may take a while to take the socket over)."""
    from mscheduler.cli.dev import _listening

    sock = _listening("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            pass
    finally:
        sock.close()
