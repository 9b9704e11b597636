"""Split a document's text into overlapping token windows.

Guarantees, for ``chunks = chunk_text(text, ...)`` with non-empty ``text``:

- ``chunk.text == text[chunk.start_char:chunk.end_char]``; no chunk splits a character, even where
  tiktoken's tokens do (a token can hold part of a multi-byte UTF-8 character);
- the chunks cover the text in order: the first starts at 0, the last ends at ``len(text)``, each starts
  after the previous one starts and at or before the previous one ends;
- ``chunk.token_count == counter.count(chunk.text) <= max_tokens``: counted on the chunk's own text, not
  taken from the whole-document tokenization (which can differ at the edges);
- ``start_line``/``end_line`` are 1-based and inclusive; lines are counted by ``"\\n"`` only (a CRLF file
  keeps its ``"\\r"`` in the text), and a chunk ending right after a ``"\\n"`` ends on that line.

Windows are ``max_tokens`` tokens long and consecutive windows share about ``overlap_tokens`` tokens.
A window ends at a line end when one falls in its last quarter, so chunks tend to hold whole lines.

Empty text gives no chunks. Whitespace-only text is chunked like any other text (usually one chunk):
coverage holds for every non-empty document, and dropping low-information chunks is the entropy
filter's job, not the chunker's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.token_counting import TokenCounter

# One character is at most 4 UTF-8 bytes, so at most 4 tokens: a window of 4 tokens always fits one.
MIN_MAX_TOKENS = 4
# A window may end early at a line end found within this final share of it.
_LINE_END_SEARCH_SHARE = 0.25


def chunk_text(text: str, *, counter: TokenCounter, max_tokens: int, overlap_tokens: int,
               bounds: npt.NDArray[np.int64] | None = None) -> list[Chunk]:
    """Split ``text`` into chunks of at most ``max_tokens`` tokens overlapping by ``overlap_tokens``.

    See the module docstring for the guarantees. ``text`` must be encodable as UTF-8 (no lone
    surrogates), which every text :func:`shardfuse.pipeline.ingest.decode.decode_content` returns is.
    ``bounds``: the text's ``char_bounds``, if the caller has them.
    """
    if max_tokens < MIN_MAX_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_MAX_TOKENS}, got {max_tokens}")
    if not 0 <= overlap_tokens < max_tokens:
        raise ValueError(f"overlap_tokens must be in [0, max_tokens), got {overlap_tokens}")
    if not text:
        return []

    bounds = counter.encode_with_offsets(text).char_bounds if bounds is None else bounds
    return _windows(text, bounds, counter, max_tokens=max_tokens, overlap_tokens=overlap_tokens)


def _windows(text: str, bounds: npt.NDArray[np.int64], counter: TokenCounter, *, max_tokens: int,
             overlap_tokens: int) -> list[Chunk]:
    """:func:`chunk_text`'s windows of ``text``, whose token boundaries are ``bounds``."""
    newlines = newline_offsets(text)
    # Token boundaries that sit right after a "\n": the places where a window may end on a line end.
    line_ends = np.flatnonzero(np.isin(bounds, np.asarray(newlines, dtype=np.int64) + 1))

    chunks: list[Chunk] = []
    window = _Window(bounds=bounds, text_len=len(text))
    start = 0
    while True:
        if not len(chunks) & 0x3F:
            checkpoint("cutting it into token windows")
        first = window.token_at(start)
        last = _choose_end_token(
            first,
            max_tokens=max_tokens,
            overlap_tokens=overlap_tokens,
            token_total=len(bounds) - 1,
            line_ends=line_ends,
        )
        end, last, token_count = _fit(
            text, window, counter, start=start, first=first, last=last, max_tokens=max_tokens
        )
        chunks.append(
            Chunk(
                ordinal=len(chunks),
                text=text[start:end],
                start_char=start,
                end_char=end,
                start_line=_line_of(newlines, start),
                end_line=_line_of(newlines, end - 1),
                token_count=token_count,
            )
        )
        if end == len(text):
            return chunks
        # Step back by the overlap, but always move forward so the loop ends and no chunk repeats.
        start = max(window.char_at(last - overlap_tokens), start + 1)


class _Window:
    """Maps between character offsets and token boundaries of one text."""

    def __init__(self, *, bounds: npt.NDArray[np.int64], text_len: int) -> None:
        self._bounds = bounds
        self._text_len = text_len

    def token_at(self, char: int) -> int:
        """The token holding character ``char`` (the last boundary at or before it)."""
        return int(np.searchsorted(self._bounds, char, side="right")) - 1

    def char_at(self, token: int) -> int:
        """The character offset of token boundary ``token`` (snapped down to a character start)."""
        return int(self._bounds[token]) if token < len(self._bounds) else self._text_len


def _choose_end_token(
    first: int, *, max_tokens: int, overlap_tokens: int, token_total: int, line_ends: npt.NDArray[np.intp]
) -> int:
    """The token boundary a window starting at token ``first`` should end at: ``max_tokens`` on, or a
    line end in the window's last quarter. Never at or before ``first + overlap_tokens``, so the next
    window, which starts ``overlap_tokens`` earlier, still moves forward."""
    last = first + max_tokens
    if last >= token_total:
        return token_total
    lowest = max(last - int(max_tokens * _LINE_END_SEARCH_SHARE), first + overlap_tokens + 1)
    # The latest line end in [lowest, last].
    i = int(np.searchsorted(line_ends, last, side="right")) - 1
    if i >= 0 and line_ends[i] >= lowest:
        return int(line_ends[i])
    return last


def _fit(
    text: str, window: _Window, counter: TokenCounter, *, start: int, first: int, last: int, max_tokens: int
) -> tuple[int, int, int]:
    """Find the chunk's end character, end token boundary and token count.

    Re-tokenising a slice can give more tokens than the slice held inside the whole document (pieces
    split differently at the edges, snapped boundaries add bytes), so count the real text and pull the
    end back by the excess until it fits. A single character is at most 4 tokens, so this terminates.
    """
    while True:
        # Ends snap down too; if that would leave nothing, take one whole character.
        end = max(window.char_at(last), start + 1)
        token_count = counter.count(text[start:end])
        if token_count <= max_tokens:
            return end, last, token_count
        last = max(last - (token_count - max_tokens), first)


def newline_offsets(text: str) -> list[int]:
    """Offsets of every ``"\\n"`` in ``text``, ascending."""
    offsets: list[int] = []
    find = text.find
    i = find("\n")
    while i != -1:
        offsets.append(i)
        i = find("\n", i + 1)
    return offsets


def _line_of(newlines: Sequence[int], char: int) -> int:
    """The 1-based line holding character ``char``: one more than the newlines before it (O(log n))."""
    return bisect_left(newlines, char) + 1
