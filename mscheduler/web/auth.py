"""Bearer tokens of the REST API: their roles, names and bindings.

Four roles: ``read`` (every GET), ``admin`` (everything, mutations included), ``executor``
(the remote-executor routes ``/api/v1/executors/...`` only: lease, ping, report; nothing else,
not even reads) and ``publish`` (sending tasks, ``POST /api/v1/tasks``, and ``GET
/api/v1/whoami``; nothing else). Tokens come from configuration (``ApiTokens(admin=[...],
read=[...], executor=[...], publish=[...])``, or ``parse_tokens`` of ``MSCHEDULER_API_TOKENS`` /
a tokens file).

Each token has a **name** (``Token(..., name="alice")``, ``name=alice`` in a tokens file; by
default ``<role>-<n>``, its position among the role's tokens): operator actions record it
(``by="api:alice"``) and the API's caps on streams and waits count per token. An executor token
may be **bound** (``Token(..., worker_prefix="resizer-", tasks=[...], groups=[...])``): it may
then lease only as worker ids with that prefix, only those task names and groups, and ping or
report only as such a worker id (an attempt is fenced by its worker id, so it cannot report
another worker's attempt).

A presented token is compared with every configured one, always all of them, with
``hmac.compare_digest`` on SHA-256 digests (equal lengths: neither the token nor its length
leaks through timing). Tokens are never logged, echoed or put in errors; ``repr`` shows only how
many there are. Refused (``InvalidInput``): a token of fewer than 16 characters, one whose
estimated entropy is under ``ENTROPY_REFUSED`` bits (``aaaaaaaaaaaaaaaa``), the same token under
two roles (which would it be?), two tokens with one name. Warned (``ApiTokens.warnings``, logged
by the app at start and printed by ``mscheduler web``): a token under ``ENTROPY_WARNED`` bits, the
same token twice in one role, a tokens file that group or others may read.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from mscheduler.domain.exceptions import InvalidInput
from mscheduler.domain.model import validate_group, validate_name

TOKEN_MIN_LEN = 16
TOKEN_MAX_LEN = 512
# The estimated entropy (bits: the characters' Shannon entropy times the length) under which a
# token is refused / warned about. ``openssl rand -hex 24`` gives about 180.
ENTROPY_REFUSED = 40
ENTROPY_WARNED = 80
TOKEN_NAME_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
# What a publish token may be given beyond sending new tasks (``may=reset``): ``reset``, re-run a
# task that ended by sending its key again (``POST /tasks?reset_finished=true``: its params and
# option replaced). An admin token may do everything.
PERMISSIONS = frozenset({"reset"})
WORKER_PREFIX_MAX = 200
BINDING_ITEMS_MAX = 100


class Role(StrEnum):
    READ = "read"
    ADMIN = "admin"
    EXECUTOR = "executor"
    PUBLISH = "publish"


@dataclass(frozen=True, slots=True)
class Token:
    """A configured token with its name and, for an executor token, what it is bound to.

    :param token: the secret (16 to 512 printable characters, no spaces).
    :param name: how actions and logs name it (letters, digits, ``_ . : @ -``; default
        ``<role>-<n>``).
    :param worker_prefix: executor tokens: lease, ping and report only as worker ids starting so.
    :param tasks: executor tokens: lease only these task names (None: any).
    :param groups: executor tokens: claim as a member of these worker groups only (None: any).
    :param may: publish tokens: what else they may do (``PERMISSIONS``: ``"reset"``).
    """

    token: str = field(repr=False)
    name: str | None = None
    worker_prefix: str | None = None
    tasks: tuple[str, ...] | None = None
    groups: tuple[str, ...] | None = None
    may: tuple[str, ...] = ()

    @property
    def bound(self) -> bool:
        return self.worker_prefix is not None or self.tasks is not None or self.groups is not None


@dataclass(frozen=True, slots=True)
class Identity:
    """Who presented a token: its role and name, and an executor token's bindings."""

    role: Role
    name: str
    worker_prefix: str | None = None
    tasks: frozenset[str] | None = None
    groups: frozenset[str] | None = None
    may: frozenset[str] = frozenset()

    def allows(self, permission: str) -> bool:
        """May this token do ``permission`` (``PERMISSIONS``)? An admin token may do everything."""
        return self.role is Role.ADMIN or permission in self.may

    @property
    def by(self) -> str:
        """What operator actions record as their author (``state.cancelled.by``, events)."""
        return f"api:{self.name}"

    def refusal(self, worker_id: str, names: Sequence[str] = (), groups: Sequence[str] = ()) -> str | None:
        """Why this identity may not act as ``worker_id`` for ``names`` / ``groups`` (None: it may)."""
        if self.worker_prefix is not None and not worker_id.startswith(self.worker_prefix):
            return f"this token may only act as worker ids starting with {self.worker_prefix!r}"
        if self.tasks is not None and (other := sorted(set(names) - self.tasks)):
            return f"this token may not lease task names {', '.join(other[:5])}"
        if self.groups is not None and (other := sorted(set(groups) - self.groups)):
            return f"this token may not claim for groups {', '.join(other[:5])}"
        return None


def _digest(token: str | bytes) -> bytes:
    raw = token.encode("utf-8", "surrogatepass") if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


def entropy_bits(token: str) -> float:
    """An estimate of a token's entropy: its characters' Shannon entropy times its length
    (``aaaa...``: 0; ``abab...``: 1 bit a character; random hex: about 3.8)."""
    n = len(token)
    return -n * sum(c / n * math.log2(c / n) for c in Counter(token).values()) if n else 0.0


def _checked_token(spec: Token | str, role: Role, n: int) -> Token:
    where = f"{role.value} token #{n}"
    if isinstance(spec, str):
        spec = Token(spec)
    if not isinstance(spec, Token):
        raise InvalidInput(f"{where}: a token string or a Token, got {type(spec).__name__}")
    token = spec.token
    if not isinstance(token, str) or not TOKEN_MIN_LEN <= len(token) <= TOKEN_MAX_LEN:
        raise InvalidInput(f"{where}: must be a string of {TOKEN_MIN_LEN} to {TOKEN_MAX_LEN} characters")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise InvalidInput(f"{where}: must not contain spaces or control characters")
    if entropy_bits(token) < ENTROPY_REFUSED:
        raise InvalidInput(
            f"{where}: too easy to guess (repeated characters); make one with `openssl rand -hex 24`"
        )
    name = spec.name if spec.name is not None else f"{role.value}-{n}"
    if not isinstance(name, str) or not TOKEN_NAME_RE.fullmatch(name):
        raise InvalidInput(f"{where}: name must be 1-64 letters, digits or '_', '.', ':', '@', '-'")
    if spec.bound and role is not Role.EXECUTOR:
        raise InvalidInput(f"{where}: worker_prefix, tasks and groups bind executor tokens only")
    prefix = spec.worker_prefix
    if prefix is not None and (
        not isinstance(prefix, str)
        or not 1 <= len(prefix) <= WORKER_PREFIX_MAX
        or prefix.startswith("$")
        or any(c.isspace() or not c.isprintable() for c in prefix)
    ):
        raise InvalidInput(f"{where}: worker_prefix must be 1-{WORKER_PREFIX_MAX} printable characters")
    tasks = _checked_list(spec.tasks, validate_name, f"{where}: tasks")
    groups = _checked_list(spec.groups, validate_group, f"{where}: groups")
    may = spec.may
    if isinstance(may, str) or not isinstance(may, Iterable) or not set(may) <= PERMISSIONS:
        raise InvalidInput(f"{where}: may is a list of {', '.join(sorted(PERMISSIONS))}")
    if may and role is not Role.PUBLISH:
        raise InvalidInput(f"{where}: may= gives a publish token more (an admin token may do everything)")
    return Token(token, name, prefix, tasks, groups, tuple(sorted(set(may))))


def _checked_list(values: object, validate: Callable[[object], str], where: str) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInput(f"{where}: a list of names")
    checked = []
    for value in values:
        try:
            checked.append(validate(value))
        except ValueError as exc:
            raise InvalidInput(f"{where}: {exc}") from None
    if not 1 <= len(checked) <= BINDING_ITEMS_MAX:
        raise InvalidInput(f"{where}: 1 to {BINDING_ITEMS_MAX} names")
    return tuple(checked)


class ApiTokens:
    """The configured tokens, kept as digests only (with their names and bindings).

    :param admin: tokens that may read and change everything.
    :param read: tokens that may only read (GET); a mutation answers 403.
    :param executor: tokens of remote executors: the executor routes only (403 elsewhere).
    :param publish: tokens of services that send tasks over HTTP (``POST /api/v1/tasks``) and do
        nothing else (403 elsewhere).

    Each item is the token string or a ``Token`` (a name, an executor token's bindings).
    ``warnings``: what is weak in this configuration (never the tokens themselves).
    """

    def __init__(
        self,
        *,
        admin: Iterable[str | Token] = (),
        read: Iterable[str | Token] = (),
        executor: Iterable[str | Token] = (),
        publish: Iterable[str | Token] = (),
        warnings: Iterable[str] = (),
    ) -> None:
        entries: list[tuple[bytes, Identity]] = []
        notes = list(warnings)
        seen: dict[bytes, tuple[Role, int]] = {}
        names: set[str] = set()
        roles = ((Role.ADMIN, admin), (Role.READ, read), (Role.EXECUTOR, executor), (Role.PUBLISH, publish))
        for role, tokens in roles:
            if isinstance(tokens, (str, Token)):
                raise InvalidInput(f"{role.value} tokens: a list of tokens, not one")
            for n, spec in enumerate(tokens, 1):
                checked = _checked_token(spec, role, n)
                digest = _digest(checked.token)
                if digest in seen:
                    first_role, first_n = seen[digest]
                    if first_role is not role:
                        raise InvalidInput(
                            f"{role.value} token #{n} is also {first_role.value} token #{first_n}: "
                            "one token, one role"
                        )
                    notes.append(f"{role.value} token #{n} repeats {role.value} token #{first_n}")
                    continue
                seen[digest] = (role, n)
                assert checked.name is not None
                if checked.name in names:
                    raise InvalidInput(f"{role.value} token #{n}: the name {checked.name!r} is taken")
                names.add(checked.name)
                if entropy_bits(checked.token) < ENTROPY_WARNED:
                    notes.append(
                        f"{role.value} token {checked.name!r} looks easy to guess (about "
                        f"{entropy_bits(checked.token):.0f} bits): make one with `openssl rand -hex 24`"
                    )
                identity = Identity(
                    role,
                    checked.name,
                    checked.worker_prefix,
                    frozenset(checked.tasks) if checked.tasks is not None else None,
                    frozenset(checked.groups) if checked.groups is not None else None,
                    frozenset(checked.may),
                )
                entries.append((digest, identity))
        if not entries:
            raise InvalidInput(
                "no API token configured: give at least one admin, read, executor or publish token"
            )
        self._entries = tuple(entries)
        self.warnings: tuple[str, ...] = tuple(notes)

    def __repr__(self) -> str:
        counts = {role: sum(i.role is role for _, i in self._entries) for role in Role}
        return (
            f"ApiTokens(admin={counts[Role.ADMIN]} token(s), read={counts[Role.READ]} token(s), "
            f"executor={counts[Role.EXECUTOR]} token(s), publish={counts[Role.PUBLISH]} token(s))"
        )

    def identify(self, presented: str) -> Identity | None:
        """Who presents this token (None: unknown). Checks every configured token."""
        digest = _digest(presented)
        found: Identity | None = None
        for expected, identity in self._entries:
            if hmac.compare_digest(digest, expected) and found is None:
                found = identity
        return found

    def role_of(self, presented: str) -> Role | None:
        """The role of a presented token (None: unknown). Checks every configured token."""
        identity = self.identify(presented)
        return identity.role if identity is not None else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(identity.name for _, identity in self._entries)


_LIST_ATTRIBUTES = {"tasks", "groups", "may"}
_ATTRIBUTES = {"name", "worker_prefix", *_LIST_ATTRIBUTES}


def parse_tokens(
    text: str, *, source: str = "MSCHEDULER_API_TOKENS", warnings: Sequence[str] = ()
) -> ApiTokens:
    """Tokens from items separated by commas or new lines (``#`` starts a comment line). An item
    is ``role:TOKEN``, optionally followed by ``name=NAME`` and, for an executor token,
    ``worker_prefix=PREFIX``, ``tasks=a|b`` and ``groups=g1|g2``, for a publish token
    ``may=reset`` (separated by spaces), e.g. ``admin:0123... name=alice`` or ``executor:ef01...
    name=resizers worker_prefix=resizer- tasks=resize|thumbnail``. The error names the item's
    position, never the token."""
    by_role: dict[str, list[Token]] = {role.value: [] for role in Role}
    items = [
        item.strip()
        for line in text.splitlines()
        if not line.strip().startswith("#")
        for item in line.split(",")
        if item.strip()
    ]
    shape = (
        f"{source}: item #{{n}} is not 'ROLE:TOKEN [name=NAME ...]' (ROLE: admin, read, executor or publish)"
    )
    for n, item in enumerate(items, 1):
        head, *attributes = item.split()
        role, sep, token = head.partition(":")
        role = role.strip().lower()
        if not sep or role not in by_role:
            raise InvalidInput(shape.format(n=n))
        fields: dict[str, object] = {}
        for attribute in attributes:
            key, eq, value = attribute.partition("=")
            if not eq or key not in _ATTRIBUTES or key in fields:
                raise InvalidInput(
                    f"{source}: item #{n}: {key!r} is not one of name=, worker_prefix=, tasks=, groups=, "
                    "may= (each at most once)"
                )
            fields[key] = tuple(value.split("|")) if key in _LIST_ATTRIBUTES else value
        by_role[role].append(Token(token.strip(), **fields))  # type: ignore[arg-type]
    try:
        return ApiTokens(
            admin=by_role["admin"],
            read=by_role["read"],
            executor=by_role["executor"],
            publish=by_role["publish"],
            warnings=warnings,
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{source}: {exc}") from None


def read_tokens_file(path: str | Path) -> ApiTokens:
    """``parse_tokens`` of a file (one item per line). A file group or others may read is
    warned about (``ApiTokens.warnings``): ``chmod 600`` it."""
    warnings = []
    try:
        text = Path(path).read_text(encoding="utf-8")
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InvalidInput(f"tokens file {str(path)!r}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.append(
            f"tokens file {str(path)!r} may be read by group or others (mode {stat.filemode(mode)}): "
            f"chmod 600 {path}"
        )
    return parse_tokens(text, source=f"tokens file {str(path)!r}", warnings=warnings)
