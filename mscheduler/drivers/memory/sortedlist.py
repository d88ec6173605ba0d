"""A sorted list kept in chunks: what the memory driver's listing indexes and open-parent index
are stored in.

A plain sorted Python list costs a move of every later element on each insertion or removal
away from its end: at 100,000 entries, tens of microseconds each, and a retention pass removes
the oldest entries, at the front. Here the entries live in chunks of at most ``CHUNK`` sorted
values, with each chunk's last value in a list of its own to bisect: an insertion or a removal
moves at most ``CHUNK`` references plus, when a chunk splits or empties, one per chunk. Walks
start where bisection puts them and go either way, as an index range does.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

CHUNK = 512  # values per chunk at most (a full chunk splits in two)


class SortedChunks:
    """Sorted, comparable values (tuples or strings; duplicates are kept)."""

    __slots__ = ("_chunks", "_lasts", "_len")

    def __init__(self) -> None:
        self._chunks: list[list[Any]] = []
        self._lasts: list[Any] = []  # the last value of each chunk
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Any]:
        for chunk in self._chunks:
            yield from chunk

    def __contains__(self, value: Any) -> bool:
        lasts = self._lasts
        i = bisect.bisect_left(lasts, value)
        if i == len(lasts):
            return False
        chunk = self._chunks[i]
        j = bisect.bisect_left(chunk, value)
        return j < len(chunk) and chunk[j] == value

    def last(self) -> Any:
        """The greatest value (IndexError when empty)."""
        return self._lasts[-1]

    def add(self, value: Any) -> None:
        chunks, lasts = self._chunks, self._lasts
        self._len += 1
        if not chunks:
            chunks.append([value])
            lasts.append(value)
            return
        if value >= lasts[-1]:  # the greatest yet (most insertions: the newest task): appended
            i = len(chunks) - 1
            chunks[i].append(value)
            lasts[i] = value
        else:
            i = bisect.bisect_left(lasts, value)
            bisect.insort(chunks[i], value)
        chunk = chunks[i]
        if len(chunk) > CHUNK:
            half = len(chunk) // 2
            chunks.insert(i + 1, chunk[half:])
            del chunk[half:]
            lasts.insert(i, chunk[-1])

    def discard(self, value: Any) -> bool:
        """Remove one occurrence of ``value``; False when there is none."""
        lasts = self._lasts
        i = bisect.bisect_left(lasts, value)
        if i == len(lasts):
            return False
        chunk = self._chunks[i]
        j = bisect.bisect_left(chunk, value)
        if j == len(chunk) or chunk[j] != value:
            return False
        del chunk[j]
        self._len -= 1
        if not chunk:
            del self._chunks[i]
            del lasts[i]
        elif j == len(chunk):
            lasts[i] = chunk[-1]
        return True

    def ascending(self, low: Any = None, *, strict: bool = False) -> Iterator[Any]:
        """The values from ``low`` up (``strict``: above it; None: from the least)."""
        chunks, lasts = self._chunks, self._lasts
        if low is None:
            i, j = 0, 0
        elif strict:
            i = bisect.bisect_right(lasts, low)
            j = bisect.bisect_right(chunks[i], low) if i < len(chunks) else 0
        else:
            i = bisect.bisect_left(lasts, low)
            j = bisect.bisect_left(chunks[i], low) if i < len(chunks) else 0
        while i < len(chunks):
            chunk = chunks[i]
            while j < len(chunk):
                yield chunk[j]
                j += 1
            i, j = i + 1, 0

    def descending(self, high: Any = None) -> Iterator[Any]:
        """The values below ``high`` (None: from the greatest), going down."""
        chunks, lasts = self._chunks, self._lasts
        if not chunks:
            return
        if high is None:
            i = len(chunks) - 1
            j = len(chunks[i])
        else:
            i = bisect.bisect_left(lasts, high)
            if i == len(chunks):
                i -= 1
                j = len(chunks[i])
            else:
                j = bisect.bisect_left(chunks[i], high)
        while i >= 0:
            chunk = chunks[i]
            while j > 0:
                j -= 1
                yield chunk[j]
            i -= 1
            j = len(chunks[i]) if i >= 0 else 0
