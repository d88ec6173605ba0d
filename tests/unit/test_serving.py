"""``mscheduler.web.serving``: the open-files budget, the connection cap's choice of whom to
close, the access log without query strings, and the CLI's defaults being the settings'."""

from __future__ import annotations

import logging
import resource
from typing import Any

import pytest

from mscheduler.cli import web as cli_web
from mscheduler.domain.exceptions import InvalidInput
from mscheduler.web import serving
from mscheduler.web.serving import ConnectionGuard, RedactQuery, ServerSettings, connection_budget


def test_the_cli_defaults_are_the_settings_defaults() -> None:
    assert (
        cli_web.DEFAULT_MAX_CONNECTIONS,
        cli_web.DEFAULT_HEADER_TIMEOUT,
        cli_web.DEFAULT_KEEP_ALIVE_TIMEOUT,
    ) == (
        ServerSettings().max_connections,
        ServerSettings().header_timeout,
        ServerSettings().keep_alive_timeout,
    )
    with pytest.raises(InvalidInput, match="header_timeout"):
        ServerSettings(header_timeout=0)
    with pytest.raises(InvalidInput, match="max_connections"):
        ServerSettings(max_connections=0)


@pytest.mark.parametrize(
    ("limits", "raised_to", "allowed"),
    [
        ((1024, 1024), 1024, 1024 - 64 - 3 * 128),  # cannot raise: fewer connections, a shorter backlog
        ((1024, 1_048_576), 1000 + 64 + 3 * 2048, 1000),  # raised as far as needed
        ((1024, 4096), 4096, 1000),  # raised to the hard limit: enough
    ],
)
def test_the_open_files_limit_is_raised_and_the_cap_fits_it(
    monkeypatch: Any, limits: tuple[int, int], raised_to: int, allowed: int
) -> None:
    current = list(limits)
    monkeypatch.setattr(resource, "getrlimit", lambda what: tuple(current))

    def setrlimit(what: int, value: tuple[int, int]) -> None:
        if value[0] > current[1]:
            raise ValueError("not allowed")
        current[0] = value[0]

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    got, backlog = connection_budget(1000)
    assert current[0] == raised_to and got == allowed
    assert got + 3 * backlog + serving.RESERVED_FILES <= current[0]  # accepting never runs out


class _Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close_idle(self) -> None:
        self.closed = True


def test_one_connection_too_many_closes_the_one_idle_longest() -> None:
    guard = ConnectionGuard(3)
    a, b, c, d, e = (_Conn(n) for n in "abcde")
    for conn in (a, b, c):
        assert guard.opened(conn)
    guard.busy(a)  # a request in progress: never closed to make room
    guard.busy(b)
    guard.idle_again(b)  # answered: idle again, and the most recently
    assert guard.opened(d) and c.closed and not a.closed and not b.closed
    guard.busy(b)
    guard.busy(d)
    assert not guard.opened(e)  # every other connection is busy: the new one goes
    assert (guard.evicted, guard.refused) == (1, 1)
    guard.closed(a)
    assert guard.opened(e)


def test_the_access_log_keeps_the_path_not_the_query() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        "",
        0,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/api/v1/tasks?token=SECRET&limit=5", "1.1", 401),
        None,
    )
    assert RedactQuery().filter(record)
    assert record.getMessage() == '127.0.0.1:5000 - "GET /api/v1/tasks?… HTTP/1.1" 401'


def test_the_server_config_redacts_the_access_log_and_guards_connections() -> None:
    config, guard = serving.uvicorn_config(object(), ServerSettings(max_connections=50), access_log=True)
    assert any(isinstance(f, RedactQuery) for f in logging.getLogger("uvicorn.access").filters)
    assert guard.max_connections == 50 and config.timeout_keep_alive == 5
    assert issubclass(config.http, __import__("uvicorn").protocols.http.h11_impl.H11Protocol)
