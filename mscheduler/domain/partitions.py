"""Partitions of a store's tasks: a task's partition is a hash of its key
modulo the store's number of partitions ``P``, fixed when the store is set up.

Every task document carries its partition (``part``); every claim, and every write about a task,
names one partition, so that on a sharded cluster (shard key ``{part: 1, _id: 1}``, a zone per
range of partitions) it reaches one shard. A claimer visits the partitions it knows to have work
(``visit_order``), starting at a random one: no partition waits behind another however skewed the
load. ``P = 1`` is an unpartitioned store (every task in partition 0).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence

MAX_PARTITIONS = 1024


def checked_partitions(partitions: object) -> int:
    """A number of partitions from 1 to ``MAX_PARTITIONS``; ``ValueError`` otherwise."""
    if (
        not isinstance(partitions, int)
        or isinstance(partitions, bool)
        or not 1 <= partitions <= MAX_PARTITIONS
    ):
        raise ValueError(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}")
    return partitions


def part_of(key: str, partitions: int) -> int:
    """The partition of the task ``key`` (stable across processes and versions: BLAKE2b of the
    key's UTF-8 bytes, the first 8 bytes big-endian, modulo ``partitions``)."""
    if partitions == 1:
        return 0
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def by_part(keys: Iterable[str], partitions: int) -> dict[int, list[str]]:
    """``keys`` grouped by partition (each group in the order given)."""
    groups: dict[int, list[str]] = {}
    for key in keys:
        groups.setdefault(part_of(key, partitions), []).append(key)
    return groups


def visit_order(
    partitions: int, with_work: Iterable[int] | None = None, rng: random.Random | None = None
) -> list[int]:
    """The partitions a claim visits, in order: those known to have work (all, if not known),
    rotated to start at a random one, so that over many claims each is first as often as the
    others (a hot partition cannot make the cold ones wait)."""
    parts = sorted(set(with_work)) if with_work is not None else list(range(partitions))
    if not parts:
        parts = list(range(partitions))
    start = (rng or random).randrange(len(parts))
    return parts[start:] + parts[:start]


def spread(attempts: Sequence[str], parts: Sequence[int]) -> list[tuple[str, int]]:
    """Attempts dealt round-robin over ``parts`` (in their visiting order)."""
    return [(attempt, parts[i % len(parts)]) for i, attempt in enumerate(attempts)]
