"""What keeps the API answering under abuse: a cap on request bodies (413), caps on concurrent
event streams and long-poll waits per token and in all (429 with ``Retry-After``), and the
headers every answer carries.

* ``BodyLimit``: a body above ``ApiLimits.max_body_bytes`` is refused with 413 before it is read
  whole — at once when its ``Content-Length`` says so, else as soon as the bytes received pass
  the cap (a chunked body). Nothing is parsed, queried or written.
* ``Slots``: how many streams (``GET /events/stream``) or waits (a lease with ``wait_seconds``)
  one token and all tokens hold; one more is a 429 ``too_many_streams`` / ``too_many_waits``.
* ``AnswerCache``: reads whose cost grows with the store (``GET /stats``) computed once a
  second at most, however many clients ask.
* ``ApiHeaders``: ``X-Content-Type-Options: nosniff`` and ``Cache-Control: no-store`` on every
  answer that does not set its own (the dashboard's files revalidate), and redirects that never
  name a host: Starlette builds a redirect's ``Location`` from the request's ``Host`` header,
  which a client chooses; it is cut to the path.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.services.events import MAX_REPLAY_LIMIT
from mscheduler.web.deps import HttpError

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """The API's caps (``create_app(limits=ApiLimits(...))``; ``mscheduler web`` options).

    :param max_body_bytes: a larger request body is a 413 (default 4 MiB: a remote executor's
        report with a 1 MB traceback and a 512 KiB result fits).
    :param streams_per_token: event streams one token may hold open at once.
    :param streams_total: event streams all tokens may hold open at once.
    :param waits_per_token: long-poll leases (``wait_seconds`` > 0) one token may have waiting.
    :param waits_total: long-poll leases all tokens may have waiting.
    :param retry_after_seconds: the ``Retry-After`` of a 429.
    :param stats_cache_seconds: ``GET /stats`` answers are reused this long (0: computed each time).
    :param replay_seconds: how far back an event stream's ``since`` (or ``Last-Event-ID``) may
        reach (a 422 beyond): a replay reads every event stored since.
    :param workers_per_token: worker ids one executor token may lease as (its workers, registered
        at their first lease); a lease as one more is a 429 ``too_many_workers``.
    :param publish_rate: tasks per second one token may send (``POST /tasks``), None: no cap;
        beyond it a 429 ``too_many_sends`` with ``Retry-After``.
    :param publish_burst: tasks one token may send at once when it has sent nothing for a while
        (with ``publish_rate``); a batch above it is refused (422).
    """

    max_body_bytes: int = 4 * MIB
    streams_per_token: int = 8
    streams_total: int = 64
    waits_per_token: int = 64
    waits_total: int = 256
    retry_after_seconds: int = 5
    stats_cache_seconds: float = 1.0
    replay_seconds: float = 3600.0
    workers_per_token: int = 64
    publish_rate: float | None = None
    publish_burst: int = 1000

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "streams_per_token",
            "streams_total",
            "waits_per_token",
            "waits_total",
            "workers_per_token",
            "publish_burst",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInput(f"{name}: a positive integer, got {value!r}")
        if self.streams_per_token > self.streams_total or self.waits_per_token > self.waits_total:
            raise InvalidInput("a per-token cap cannot be above the total cap")
        if not isinstance(self.retry_after_seconds, int) or not 1 <= self.retry_after_seconds <= 3600:
            raise InvalidInput("retry_after_seconds: an integer from 1 to 3600")
        if not isinstance(self.stats_cache_seconds, (int, float)) or not 0 <= self.stats_cache_seconds <= 60:
            raise InvalidInput("stats_cache_seconds: from 0 to 60")
        if not _number(self.replay_seconds) or not 0 < self.replay_seconds <= MAX_REPLAY_LIMIT:
            raise InvalidInput(f"replay_seconds: more than 0 and at most {MAX_REPLAY_LIMIT:.0f} (a week)")
        if self.publish_rate is not None and (not _number(self.publish_rate) or not self.publish_rate > 0):
            raise InvalidInput("publish_rate: tasks per second, more than 0 (or None: no cap)")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


class BodyTooLarge(HTTPException):
    """Raised from the body's ``receive`` once more than the cap arrived (a 413 answer)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body is larger than {max_bytes} bytes")
        self.max_bytes = max_bytes


def too_large_detail(max_bytes: int) -> str:
    return f"the request body is larger than {max_bytes} bytes (the server's max_body_bytes)"


class BodyLimit:
    """ASGI middleware: 413 for a body above ``max_bytes``, before it is read whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.strip().isdigit() and int(value) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await HttpError(413, "payload_too_large", too_large_detail(self.max_bytes)).response()(
            scope, receive, send
        )


class Slots:
    """Concurrent holders of one kind (``what``: "streams", "waits"): at most ``per_token`` for
    one token, ``total`` in all. One event loop: no lock."""

    def __init__(self, what: str, per_token: int, total: int) -> None:
        self.what = what
        self.per_token = per_token
        self.total = total
        self._held: Counter[str] = Counter()
        self._all = 0

    def acquire(self, holder: str) -> str | None:
        """Take a slot for ``holder`` (a token's name); the refusal's reason when none is free."""
        if self._held[holder] >= self.per_token:
            return (
                f"this token holds {self._held[holder]} {self.what} (at most {self.per_token} per "
                f"token): close one or try again later"
            )
        if self._all >= self.total:
            return f"the server holds {self._all} {self.what} (at most {self.total} in all): try again later"
        self._held[holder] += 1
        self._all += 1
        return None

    def release(self, holder: str) -> None:
        if self._held[holder] > 0:
            self._held[holder] -= 1
            self._all -= 1
            if not self._held[holder]:
                del self._held[holder]

    def held(self, holder: str | None = None) -> int:
        return self._all if holder is None else self._held[holder]


WORKER_IDLE_SECONDS = 600.0  # a worker id that has not leased for this long no longer counts


class WorkerIds:
    """The worker ids each executor token leases as (``ApiLimits.workers_per_token``): each
    lease as a new id registers a worker in the store, so a token may have at most that many
    that leased within ``idle`` seconds; one more is refused (``admit`` says why). Bounded:
    at most ``per_token`` ids per token are remembered."""

    def __init__(
        self, per_token: int, idle: float = WORKER_IDLE_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_token = per_token
        self.idle = idle
        self.clock = clock
        self._seen: dict[str, dict[str, float]] = {}  # token name -> worker id -> last lease

    def admit(self, holder: str, worker_id: str) -> str | None:
        now = self.clock()
        seen = self._seen.setdefault(holder, {})
        if worker_id not in seen and len(seen) >= self.per_token:
            for old in [w for w, when in seen.items() if now - when > self.idle]:
                del seen[old]
            if len(seen) >= self.per_token:
                return (
                    f"this token leases as {len(seen)} worker ids (at most {self.per_token} per token "
                    f"within {self.idle:g} s): reuse a worker id"
                )
        seen[worker_id] = now
        return None


class SendRate:
    """Tasks each token may send (``ApiLimits.publish_rate`` a second, ``publish_burst`` at once:
    a bucket per token that refills at the rate). ``take`` answers beyond it: a 429
    ``too_many_sends`` with ``Retry-After`` (when the bucket holds the batch again), a batch
    above the burst a 422 (it could never go). No rate: nothing is counted."""

    def __init__(self, rate: float | None, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # token name -> (tasks left, when)

    def take(self, holder: str, count: int) -> None:
        rate = self.rate
        if rate is None:
            return
        if count > self.burst:
            raise HttpError(
                422,
                "invalid_input",
                f"a batch of {count} tasks is more than this server sends at once "
                f"for a token ({self.burst}): send smaller batches",
            )
        now = self.clock()
        left, when = self._buckets.get(holder, (float(self.burst), now))
        left = min(float(self.burst), left + (now - when) * rate)
        if left < count:
            wait = max(1, math.ceil((count - left) / rate))
            raise HttpError(
                429,
                "too_many_sends",
                f"this token may send {rate:g} tasks a second ({self.burst} at once): try again in {wait} s",
                headers={"Retry-After": str(wait)},
            )
        self._buckets[holder] = (left - count, now)


API_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store"))


class ApiHeaders:
    """ASGI middleware: the headers every answer carries (``nosniff``, ``no-store`` unless it
    sets its own caching) and a ``Location`` without scheme or host."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"location"]
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in API_HEADERS if k not in present]
                for k, v in message.get("headers", ()):
                    if k.lower() == b"location":
                        headers.append((b"location", _relative(v)))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _relative(location: bytes) -> bytes:
    """A redirect target without scheme and host (kept as given when it has none)."""
    text = location.decode("latin-1")
    parts = urlsplit(text)
    if not parts.scheme and not parts.netloc:
        return location
    path = parts.path or "/"
    if path.startswith("//"):  # "//evil.example/x" would name a host again
        path = "/" + path.lstrip("/")
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")


class AnswerCache:
    """Answers reused for ``ttl`` seconds, computed once however many ask at the same time
    (the others wait for that computation). For reads whose cost grows with the store and whose
    answer may be a moment old: ``GET /stats`` (``ApiLimits.stats_cache_seconds``). A failed
    computation is not kept; ``ttl`` 0 computes every time."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._kept: dict[str, tuple[float, bytes]] = {}
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self.computed = 0

    async def get(self, key: str, compute: Callable[[], Awaitable[bytes]]) -> bytes:
        if self.ttl <= 0:
            self.computed += 1
            return await compute()
        kept = self._kept.get(key)
        if kept is not None and time.monotonic() - kept[0] < self.ttl:
            return kept[1]
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._compute(key, compute))
        return await asyncio.shield(pending)  # a caller that goes away does not cancel it

    async def _compute(self, key: str, compute: Callable[[], Awaitable[bytes]]) -> bytes:
        try:
            started = time.monotonic()
            value = await compute()
            self.computed += 1
            self._kept[key] = (started, value)
            if len(self._kept) > 64:  # a few keys in practice (the windows asked for)
                self._kept.pop(next(iter(self._kept)))
            return value
        finally:
            del self._pending[key]
