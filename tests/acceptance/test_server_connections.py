"""``mscheduler dev`` (the server of ``mscheduler web`` too: ``mscheduler.web.serving``) against
clients that hold connections without finishing a request, under an open-files limit of 1,024
(soft and hard, a common service default): 300 connections that trickle a header line now and
then, 1,100 that send nothing. ``/api/v1/health`` still answers within a second on a fresh
connection, the trickling ones are closed after the header timeout, and once the clients are
gone the server answers as before and stops cleanly. A subprocess on loopback; the waits are
bounds, not sleeps for a result."""

from __future__ import annotations

import re
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.acceptance.support import Running, command

APP = "examples.shop:app"
TOKEN = "conn-test-token-0123456789abcdef"
SLOW = 300
IDLE = 1_100
HEADER_TIMEOUT = 2.0
FILES = 1024
# the command under an open-files limit it cannot raise (soft = hard)
LIMITED = [
    sys.executable,
    "-c",
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]),) * 2); "
    "os.execvp(sys.argv[2], sys.argv[2:])",
    str(FILES),
]


@pytest.fixture
def sockets_to_spare() -> Iterator[None]:
    """This process opens some 1,500 sockets: its own soft limit raised for the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = SLOW + IDLE + 256
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the open-files hard limit ({hard}) is below the {need} sockets this test opens")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def health(port: int, timeout: float) -> tuple[bool, float]:
    """GET /api/v1/health on a new connection: (answered 200, seconds)."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.settimeout(max(0.01, timeout - (time.monotonic() - started)))
            conn.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = conn.recv(64)
    except OSError:
        return False, time.monotonic() - started
    return answer.startswith(b"HTTP/1.1 200"), time.monotonic() - started


def closed_by_server(conn: socket.socket) -> bool:
    conn.setblocking(False)
    try:
        return conn.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def trickle(conns: list[socket.socket], stop: threading.Event) -> None:
    """A header line on each connection every half second, never the blank line that ends them."""
    n = 0
    while not stop.wait(0.5):
        n += 1
        for conn in conns:
            try:
                conn.send(f"X-Slow-{n}: {'a' * 20}\r\n".encode())
            except OSError:
                pass


def test_slow_and_idle_clients_do_not_keep_health_from_answering(sockets_to_spare: None) -> None:
    proc = Running(
        [
            *LIMITED,
            *command(),
            "dev",
            APP,
            "--port",
            "0",
            "--token",
            TOKEN,
            "--header-timeout",
            str(HEADER_TIMEOUT),
        ]
    )
    slow: list[socket.socket] = []
    idle: list[socket.socket] = []
    stop = threading.Event()
    trickler = threading.Thread(target=trickle, args=(slow, stop), daemon=True)
    try:
        port = _started(proc)
        # the limit leaves room for fewer connections than the default: the server says so
        assert "the open-files limit leaves room for" in proc.output
        try:
            for _ in range(SLOW):
                conn = socket.create_connection(("127.0.0.1", port), timeout=10)
                slow.append(conn)
                conn.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
            trickler.start()
            for _ in range(IDLE):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            answers = [health(port, 5) for _ in range(5)]
            assert all(ok for ok, _ in answers), answers
            assert max(seconds for _, seconds in answers) < 1.0, answers

            # the trickling connections never finish their headers: closed by the header timeout
            deadline = time.monotonic() + HEADER_TIMEOUT + 10
            while not all(closed_by_server(c) for c in slow) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert all(closed_by_server(c) for c in slow)
        finally:
            stop.set()
            for conn in slow + idle:
                conn.close()
        ok, seconds = health(port, 5)
        assert ok and seconds < 1.0  # recovered: a client as any other
        proc.signal(signal.SIGINT)
        assert proc.finish(timeout=30) == 0, proc.output
        assert "Traceback" not in proc.output and "Too many open files" not in proc.output
    finally:
        proc.kill()  # whatever happened above: never left running


def _started(proc: Running) -> int:
    """The server's port, once it answers."""
    proc.wait_for(r"^Ctrl\+C to stop", timeout=60)
    found = re.search(r"REST API +http://127\.0\.0\.1:(\d+)/api/v1", proc.output)
    assert found is not None, proc.output
    port = int(found.group(1))
    deadline = time.monotonic() + 30  # "Ctrl+C to stop" comes as the server starts listening
    while not health(port, 5)[0]:
        assert time.monotonic() < deadline, proc.output
        time.sleep(0.1)
    return port
