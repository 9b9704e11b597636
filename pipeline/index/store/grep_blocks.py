"""The grep index's data, as pure functions: a document's text cut into blocks of whole lines, each block's
trigrams, and the COPY rows of ``grep_blocks`` (:mod:`shardfuse.pipeline.index.store.grep_store`).

Blocks hold whole lines (lines counted by ``"\\n"``, as the chunkers count them), so a line is never split
the way chunks split it (a chunk starts mid-line; a match across a chunk boundary would be lost searching
chunks). A block's *grams* are the distinct trigrams of its :func:`normalized` UTF-8 bytes, each packed into
one int4 (``b0 << 16 | b1 << 8 | b2``: 0 to 2**24 - 1), plus one negative pseudo-gram for its zone
(:func:`zone_gram`), so that the GIN index narrows to the zone too. A query asks for blocks holding every
gram of its literal (``grams @> ARRAY[...]``) and verifies their lines itself (:mod:`shardfuse.query.grep`).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any

import numpy as np

from shardfuse.pipeline.core.documents import Chunk, TextBlock, chunk_id

# A block ends after this many lines, or at the first line that takes it to this many characters (a single
# longer line is a block of its own: blocks hold whole lines).
BLOCK_LINES = 64
BLOCK_CHARS = 4096

# Characters outside ASCII that Unicode simple case folding (RE2's and Python's case-insensitive matching)
# puts with an ASCII letter: the Kelvin sign with k, the long s with s. Mapped to that letter before the
# grams are taken, so a case-insensitive "k" finds a line that holds the Kelvin sign.
_FOLDS = str.maketrans({"\u212a": "k", "\u017f": "s"})
# ASCII upper case to lower case, every other byte as it is (a UTF-8 sequence keeps its bytes).
_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[ord("A") : ord("Z") + 1] += 32


def cut_blocks(text: str, *, max_lines: int = BLOCK_LINES, max_chars: int = BLOCK_CHARS) -> tuple[TextBlock, ...]:
    """``text``'s lines in blocks of whole lines, each with its first line's number (1-based). A final
    ``"\\n"`` ends the last line, it does not open another (as :attr:`Decoded.line_count` counts)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    blocks: list[TextBlock] = []
    start, chars = 0, 0
    for i, line in enumerate(lines):
        chars += len(line) + 1
        if i + 1 - start >= max_lines or chars >= max_chars or i + 1 == len(lines):
            blocks.append(TextBlock(start_line=start + 1, text="\n".join(lines[start : i + 1])))
            start, chars = i + 1, 0
    return tuple(blocks)


def normalized(text: str) -> bytes:
    """What grams are taken of: UTF-8, with ASCII letters (and the two non-ASCII folds of ASCII letters)
    lower-cased. Every other character keeps its bytes, so a substring of the text is a substring here."""
    # str.translate looks every character up: skip it for the (usual) text holding neither fold.
    if "\u212a" in text or "\u017f" in text:
        text = text.translate(_FOLDS)
    data = text.encode("utf-8")
    return _LOWER[np.frombuffer(data, dtype=np.uint8)].tobytes()


def grams_of(data: bytes) -> np.ndarray[Any, np.dtype[np.int32]]:
    """The distinct packed trigrams of ``data`` (already :func:`normalized`), ascending."""
    if len(data) < 3:
        return np.zeros(0, dtype=np.int32)
    b = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    grams = (b[:-2] << 16) | (b[1:-1] << 8) | b[2:]
    # np.unique, by hand: a sort and a mask of each value unlike its predecessor take 53 µs for a 3 KB block
    # here against np.unique's 136 (its general path), and the grams are the shard write's largest Python cost.
    grams.sort()
    first = np.empty(len(grams), dtype=bool)
    first[0] = True
    np.not_equal(grams[1:], grams[:-1], out=first[1:])
    return grams[first]


def zone_gram(zone: str) -> int:
    """The zone's pseudo-gram: negative, so it never equals a trigram (a collision of two zones only adds
    candidates; the zone is in every query's WHERE too)."""
    return -1 - (int.from_bytes(hashlib.sha256(zone.encode("utf-8")).digest()[:4], "big") & 0x7FFF_FFFF)


def block_grams(text: str, zone: str) -> list[int]:
    """The ``grams`` column of a block of ``zone``."""
    grams: list[int] = block_gram_array(text, zone).tolist()
    return grams


def block_gram_array(text: str, zone: str) -> np.ndarray[Any, np.dtype[np.int32]]:
    """:func:`block_grams` as an int32 array (what the COPY row carries: no Python int per gram)."""
    grams = grams_of(normalized(text))
    return np.concatenate((np.array([zone_gram(zone)], dtype=np.int32), grams.astype(np.int32, copy=False)))


def _spans(ordered: Sequence[Chunk], starts: list[int], reach: list[int], first: int, last: int) -> list[int]:
    """The chunks holding any of lines ``first``..``last``, flattened as ``[ordinal, start_line, end_line, ...]``
    (the ``chunk_lines`` column), from ``ordered`` (by start line): a grep hit names the chunk that holds its
    line (:func:`chunk_at`)."""
    # reach[i]: the furthest line any of the first i + 1 chunks (by start) ends on, so before ``lo`` none
    # reaches ``first`` and from ``hi`` on none starts by ``last``.
    lo, hi = bisect_left(reach, first), bisect_right(starts, last)
    return [v for c in ordered[lo:hi] if c.end_line >= first for v in (c.ordinal, c.start_line, c.end_line)]


def chunk_at(spans: Sequence[int], line: int) -> int | None:
    """The ordinal of the first chunk of ``spans`` (a ``chunk_lines`` value) that holds ``line``; None when
    no chunk holds it (a line the entropy filter dropped, or whitespace between chunks)."""
    found = [spans[i] for i in range(0, len(spans) - 2, 3) if spans[i + 1] <= line <= spans[i + 2]]
    return min(found) if found else None


def block_rows(*, zone: str, path: str, seq: int, blocks: Sequence[TextBlock],
               chunks: Sequence[Chunk]) -> Iterator[tuple[Any, ...]]:
    """One COPY row per block (:data:`shardfuse.pipeline.index.store.grep_store.BLOCK_COLUMNS`)."""
    ordered = sorted(chunks, key=lambda c: (c.start_line, c.ordinal))
    starts = [c.start_line for c in ordered]
    reach = list(accumulate((c.end_line for c in ordered), max))
    for number, block in enumerate(blocks):
        last = block.start_line + block.text.count("\n")
        # PostgreSQL text cannot hold NUL; decode rejects NUL-laden content, this is the last guard.
        text = block.text.replace("\x00", "\ufffd")
        yield (zone, path, number, seq, block.start_line, text,
               _spans(ordered, starts, reach, block.start_line, last), block_gram_array(text, zone))


def line_chunk_id(*, zone: str, path: str, seq: int, spans: Sequence[int], line: int) -> str | None:
    """The id of the chunk holding ``line`` of the document written at ``seq`` (None when none holds it)."""
    ordinal = chunk_at(spans, line)
    return None if ordinal is None else chunk_id(zone, path, seq, ordinal)
