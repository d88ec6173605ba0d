"""Bearer tokens of the REST API and their roles.

Four roles: ``read`` (every GET), ``admin`` (everything, mutations included), ``executor``
(the remote-executor routes ``/api/v1/executors/...`` only: lease, ping, report; nothing else,
not even reads) and ``publish`` (sending tasks, ``POST /api/v1/tasks``, and ``GET
/api/v1/whoami``; nothing else). Tokens come from configuration (``ApiTokens(admin=[...],
read=[...], executor=[...], publish=[...])``, or ``parse_tokens`` of
``MSCHEDULER_API_TOKENS`` / a tokens file). A presented token is compared with every configured
one, always all of them, with ``hmac.compare_digest`` on SHA-256 digests (equal lengths: neither
the token nor its length leaks through timing). Tokens are never logged, echoed or put in errors;
``repr`` shows only how many there are.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path

from mscheduler.domain.exceptions import InvalidInput

TOKEN_MIN_LEN = 16
TOKEN_MAX_LEN = 512


class Role(StrEnum):
    READ = "read"
    ADMIN = "admin"
    EXECUTOR = "executor"
    PUBLISH = "publish"


def _digest(token: str | bytes) -> bytes:
    raw = token.encode("utf-8", "surrogatepass") if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


class ApiTokens:
    """The configured tokens, kept as digests only.

    :param admin: tokens that may read and change everything.
    :param read: tokens that may only read (GET); a mutation answers 403.
    :param executor: tokens of remote executors: the executor routes only (403 elsewhere).
    :param publish: tokens of services that send tasks over HTTP (``POST /api/v1/tasks``) and do
        nothing else (403 elsewhere).
    """

    def __init__(
        self,
        *,
        admin: Iterable[str] = (),
        read: Iterable[str] = (),
        executor: Iterable[str] = (),
        publish: Iterable[str] = (),
    ) -> None:
        entries: list[tuple[bytes, Role]] = []
        roles = ((Role.ADMIN, admin), (Role.READ, read), (Role.EXECUTOR, executor), (Role.PUBLISH, publish))
        for role, tokens in roles:
            if isinstance(tokens, str):
                raise InvalidInput(f"{role.value} tokens: a list of tokens, not one string")
            for n, token in enumerate(tokens, 1):
                if not isinstance(token, str) or not TOKEN_MIN_LEN <= len(token) <= TOKEN_MAX_LEN:
                    raise InvalidInput(
                        f"{role.value} token #{n}: must be a string of {TOKEN_MIN_LEN} to "
                        f"{TOKEN_MAX_LEN} characters"
                    )
                if any(c.isspace() or not c.isprintable() for c in token):
                    raise InvalidInput(
                        f"{role.value} token #{n}: must not contain spaces or control characters"
                    )
                entries.append((_digest(token), role))
        if not entries:
            raise InvalidInput(
                "no API token configured: give at least one admin, read, executor or publish token"
            )
        self._entries = tuple(entries)

    def __repr__(self) -> str:
        counts = {role: sum(r is role for _, r in self._entries) for role in Role}
        return (
            f"ApiTokens(admin={counts[Role.ADMIN]} token(s), read={counts[Role.READ]} token(s), "
            f"executor={counts[Role.EXECUTOR]} token(s), publish={counts[Role.PUBLISH]} token(s))"
        )

    def role_of(self, presented: str) -> Role | None:
        """The role of a presented token (None: unknown). Checks every configured token."""
        digest = _digest(presented)
        found: Role | None = None
        for expected, role in self._entries:
            if hmac.compare_digest(digest, expected) and found is not Role.ADMIN:
                found = role
        return found


def parse_tokens(text: str, *, source: str = "MSCHEDULER_API_TOKENS") -> ApiTokens:
    """Tokens from ``role:token`` items separated by commas or new lines (``#`` starts a comment
    line), e.g. ``admin:0123...,read:abcd...,executor:ef01...``. The error names the item's
    position, never the token."""
    by_role: dict[str, list[str]] = {role.value: [] for role in Role}
    items = [
        item.strip()
        for line in text.splitlines()
        if not line.strip().startswith("#")
        for item in line.split(",")
        if item.strip()
    ]
    for n, item in enumerate(items, 1):
        role, sep, token = item.partition(":")
        role = role.strip().lower()
        if not sep or role not in by_role:
            raise InvalidInput(
                f"{source}: item #{n} is not 'admin:TOKEN', 'read:TOKEN', 'executor:TOKEN' or 'publish:TOKEN'"
            )
        by_role[role].append(token.strip())
    try:
        return ApiTokens(
            admin=by_role["admin"],
            read=by_role["read"],
            executor=by_role["executor"],
            publish=by_role["publish"],
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{source}: {exc}") from None


def read_tokens_file(path: str | Path) -> ApiTokens:
    """``parse_tokens`` of a file (one ``role:token`` per line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"tokens file {str(path)!r}: {exc.strerror or exc}") from None
    return parse_tokens(text, source=f"tokens file {str(path)!r}")
