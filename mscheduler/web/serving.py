"""How ``mscheduler web`` and ``mscheduler dev`` serve the app with uvicorn so that slow and idle
clients cannot hold the server's connections (``ServerSettings``):

* a request's headers must arrive within ``header_timeout`` seconds of the connection (or of the
  previous response on a kept-alive connection), however slowly they trickle in; then the
  connection is closed. uvicorn's own keep-alive timer restarts at every byte, so a client that
  sends a header line now and then would hold a connection for ever;
* an idle kept-alive connection is closed after ``keep_alive_timeout`` seconds (uvicorn's);
* at most ``max_connections`` are open at once: one more closes the connection that has been
  idle longest (no request in progress: it has not finished its headers, or waits between
  requests), so a client that opens connections and sends nothing cannot lock the others out;
  when every connection is busy with a request, the new one is closed at once;
* the process's open-files limit is raised (to the hard limit, where the OS allows) so the
  connections fit, and ``max_connections`` and the listen backlog are lowered to what the limit
  allows when it does not (``connection_budget``): the server never runs out of file
  descriptors, which would stop it accepting even ``/api/v1/health``;
* the access log keeps each request's path, never its query string (``RedactQuery``): a token
  put in a URL by mistake is not written to the log.

These are defences of a server facing a network; in production, put a reverse proxy in front
(docs/api.md has a recipe) that buffers requests and enforces its own limits.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mscheduler.domain.exceptions import InvalidInput

log = logging.getLogger("mscheduler.web")

DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0
# file descriptors kept for what is not a client connection (the listening socket, the store's
# connections, log files, a snapshot being written)
RESERVED_FILES = 64


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """How the server treats connections (``mscheduler web`` / ``dev`` options).

    :param max_connections: connections open at once (one more closes the longest idle one).
    :param header_timeout: seconds a client has to send a request's headers.
    :param keep_alive_timeout: seconds an idle kept-alive connection stays open.
    """

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    keep_alive_timeout: float = DEFAULT_KEEP_ALIVE_TIMEOUT

    def __post_init__(self) -> None:
        if isinstance(self.max_connections, bool) or not isinstance(self.max_connections, int):
            raise InvalidInput("max_connections: an integer")
        if not 1 <= self.max_connections <= 1_000_000:
            raise InvalidInput("max_connections: from 1 to 1,000,000")
        for name in ("header_timeout", "keep_alive_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.1 <= value <= 3600:
                raise InvalidInput(f"{name}: from 0.1 to 3600 seconds")


MAX_ACCEPT_BATCH = 2048  # uvicorn's listen backlog


def connection_budget(wanted: int) -> tuple[int, int]:
    """Raise this process's open-files limit (RLIMIT_NOFILE) to fit ``wanted`` connections, as
    far as the hard limit allows; then (how many connections the limit leaves room for, the
    listen backlog). The event loop accepts up to a backlog's worth of connections at once,
    before the cap closes any, and closes them a loop turn or two later: three backlogs are
    kept free, so accepting never fails for want of a file descriptor (which would stop the
    server accepting for a second, ``/api/v1/health`` included)."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to raise
        return wanted, MAX_ACCEPT_BATCH
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + RESERVED_FILES + 3 * MAX_ACCEPT_BATCH
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d: %s", soft, exc)
    if soft == resource.RLIM_INFINITY:
        return wanted, MAX_ACCEPT_BATCH
    batch = max(16, min(MAX_ACCEPT_BATCH, soft // 8))
    return max(1, min(wanted, soft - RESERVED_FILES - 3 * batch)), batch


class ConnectionGuard:
    """The open connections of one server, the idle ones in the order they became idle. A
    connection it closed stops counting at once (its end is seen a loop turn later)."""

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self.counted: set[Any] = set()
        self.idle: OrderedDict[Any, None] = OrderedDict()
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # new connections closed because every other one was busy

    def opened(self, protocol: Any) -> bool:
        """A new connection; False when it must be closed (every other one is busy)."""
        while len(self.counted) >= self.max_connections:
            if not self.idle:
                self.refused += 1
                return False
            oldest, _ = self.idle.popitem(last=False)
            self.counted.discard(oldest)
            self.evicted += 1
            oldest.close_idle()
        self.counted.add(protocol)
        self.idle[protocol] = None
        return True

    def busy(self, protocol: Any) -> None:
        self.idle.pop(protocol, None)

    def idle_again(self, protocol: Any) -> None:
        if protocol in self.counted:
            self.idle[protocol] = None
            self.idle.move_to_end(protocol)

    def closed(self, protocol: Any) -> None:
        self.idle.pop(protocol, None)
        self.counted.discard(protocol)


def guarded_protocol(settings: ServerSettings, guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the header deadline and the connection cap (see the module)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    header_timeout = settings.header_timeout

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if not guard.opened(self):
                self.transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            guard.closed(self)
            super().connection_lost(exc)

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:  # a request's headers arrived: it is busy until answered
                self._disarm()
                guard.busy(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                guard.idle_again(self)
                self._arm()  # the next request's headers: within the timeout again

        def close_idle(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.close()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout, self.close_idle)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

    return GuardedH11Protocol


class RedactQuery(logging.Filter):
    """uvicorn's access log lines with the path only: a query string is replaced by ``?…``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?…", *args[3:])
        return True


def uvicorn_config(app: Any, settings: ServerSettings, **options: Any) -> tuple[Any, ConnectionGuard]:
    """A ``uvicorn.Config`` for ``app`` under ``settings`` (the open-files limit raised first),
    and the guard of its connections; ``options``: uvicorn's own (host, port, log_config,
    access_log, lifespan, ...)."""
    import uvicorn

    allowed, backlog = connection_budget(settings.max_connections)
    if allowed < settings.max_connections:
        log.warning(
            "the open-files limit leaves room for %d connections: serving at most that many "
            "(raise the limit, e.g. `ulimit -n`, for %d)",
            allowed,
            settings.max_connections,
        )
    guard = ConnectionGuard(allowed)
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQuery) for f in access.filters):
        access.addFilter(RedactQuery())
    config = uvicorn.Config(
        app,
        http=guarded_protocol(settings, guard),
        timeout_keep_alive=max(1, math.ceil(settings.keep_alive_timeout)),
        backlog=backlog,
        **options,
    )
    return config, guard
