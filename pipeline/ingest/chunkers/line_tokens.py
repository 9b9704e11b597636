"""Token counts of a document's line ranges, read off one tokenization of the whole text (the semantic chunker's
counting: :mod:`shardfuse.pipeline.ingest.chunkers.semantic`)."""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.core.token_counting import TokenCounter

_BREAK_AFTER_INDENT = re.compile(r"[^\S\r\n]*[\r\n]")
# Encodings whose pre-split takes a run of line breaks up to its last "\n" (``\s*[\r\n]+``), see LineTokens.
_LINE_AWARE_ENCODINGS = frozenset({"cl100k_base", "o200k_base"})


class LineTokens:
    """Token counts of line ranges, read off one tokenization of the whole text.

    cl100k and o200k pre-split text so that no piece runs from a line's ``"\\n"`` into the next line when that
    line holds something other than whitespace before any ``"\\r"`` or ``"\\n"`` of its own. So a range that
    starts and ends at such line starts (or at the text's ends) counts exactly the whole text's tokens between
    them, and counts of adjacent ranges add up. Any other range, and any range in another encoding, is counted
    on its own.
    """

    def __init__(self, text: str, counter: TokenCounter) -> None:
        self.counter = counter
        self._text = text
        self._line_aware = counter.encoding_name in _LINE_AWARE_ENCODINGS
        self._bounds = counter.encode_with_offsets(text).char_bounds if self._line_aware else np.zeros(0, np.int64)

    def marks(self, positions: list[int]) -> list[tuple[bool, int | None]]:
        """``(clean, boundary)`` of each of ``positions``, as :meth:`clean` and :meth:`_boundary` give them, with
        one vectorised search (a block's start and end are each looked up once, not twice)."""
        if not len(self._bounds):
            return [(self.clean(pos), None) for pos in positions]
        at = np.searchsorted(self._bounds, positions)
        hits = (self._bounds[np.minimum(at, len(self._bounds) - 1)] == positions).tolist()
        # clean() inlined for the common case, a position right after a "\n" (every block starts a line): a
        # document of a hundred thousand blocks has as many positions. Only a line-aware encoding has bounds, so
        # clean()'s check of the encoding holds here.
        text = self._text
        marks: list[tuple[bool, int | None]] = []
        for pos, i, hit in zip(positions, at.tolist(), hits, strict=True):
            if 0 < pos < len(text) and text[pos - 1] == "\n":
                clean = not text[pos].isspace() or not _BREAK_AFTER_INDENT.match(text, pos)
            else:
                clean = self.clean(pos)
            marks.append((clean, i if clean and hit else None))
        return marks

    def count(self, start: int, end: int) -> int:
        """The number of tokens of ``text[start:end]``, as :meth:`TokenCounter.count` gives it."""
        first, last = self._boundary(start), self._boundary(end)
        if first is None or last is None:
            return self.counter.count(self._text[start:end])
        return last - first

    def bounds_within(self, start: int, end: int) -> npt.NDArray[np.int64] | None:
        """The token boundaries of ``text[start:end]`` as offsets into it, read off the whole text's tokenization
        (its own ends added), or None without one. A token window needs only where tokens fall: it counts its own
        text, so a slice that would tokenize differently at its edges costs nothing but a window's exact end. A
        1 MB line of unclosed HTML tags was encoded twice without this."""
        if not len(self._bounds):
            return None
        lo = int(np.searchsorted(self._bounds, start, side="right"))
        hi = int(np.searchsorted(self._bounds, end, side="left"))
        return np.concatenate(([0], self._bounds[lo:hi] - start, [end - start]), dtype=np.int64)

    def clean(self, pos: int) -> bool:
        """Whether no token of the text can cross ``pos`` (see the class docstring)."""
        if pos in (0, len(self._text)):
            return True
        if not self._line_aware or self._text[pos - 1] != "\n":
            return False
        # A line that starts with anything but whitespace cannot be blank: the pattern is not needed there.
        return not self._text[pos].isspace() or not _BREAK_AFTER_INDENT.match(self._text, pos)

    def _boundary(self, pos: int) -> int | None:
        """The index of the token boundary at ``pos`` if ``pos`` is clean, else None."""
        if not self.clean(pos):
            return None
        i = int(np.searchsorted(self._bounds, pos))
        return i if i < len(self._bounds) and self._bounds[i] == pos else None
