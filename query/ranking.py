"""Ranking after fusion, as pure functions: diversification and how much text each result carries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def diversify(hits: Iterable[T], *, key: Callable[[T], str], max_per_key: int | None) -> Iterator[T]:
    """Keep ranking order but at most ``max_per_key`` hits per key (per file); ``None`` keeps everything."""
    if max_per_key is None:
        yield from hits
        return
    if max_per_key < 1:
        raise ValueError("max_per_key must be at least 1")
    seen: Counter[str] = Counter()
    for hit in hits:
        group = key(hit)
        if seen[group] < max_per_key:
            seen[group] += 1
            yield hit


def snippet(text: str, *, max_chars: int) -> str:
    """The start of ``text`` with whitespace folded, cut at a word boundary and marked when cut."""
    folded = " ".join(text.split())
    if len(folded) <= max_chars:
        return folded
    cut = folded[: max_chars - 1]
    if folded[max_chars - 1] != " ":  # the cut falls inside a word: end at the previous space
        space = cut.rfind(" ")
        cut = cut[:space] if space > max_chars // 2 else cut
    return cut + "…"
