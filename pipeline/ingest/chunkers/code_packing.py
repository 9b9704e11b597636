"""Packing a code file's units into ranges of at most a token budget; :mod:`.code` makes them spans."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, repeat

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.code_units import Unit
from shardfuse.pipeline.ingest.chunkers.token_windows import chunk_text

# A unit whose lines count up to this share of the budget is counted whole before it is declared too large.
_NEAR = 1.25
# Lines up to this long have their counts remembered (longer ones rarely repeat).
_MEMO_LINE_CHARS = 200


# Not frozen, for speed (never mutated): see markup_blocks.Block.
@dataclass(slots=True)
class Group:
    """Consecutive units packed together; a single unit larger than the budget when ``fits`` is False."""

    units: tuple[Unit, ...]
    fits: bool

    @property
    def start(self) -> int:
        return self.units[0].start

    @property
    def end(self) -> int:
        return self.units[-1].end


class Packer:
    """Packs units of one text into ranges of at most ``max_tokens`` tokens.

    Every line is counted once (a distinct short line once a file); the sum over a range's lines is its
    estimate, used to choose where to cut. Every range it returns is then counted whole (tokens can merge or
    split differently across lines) and shrunk until it fits; those exact counts are kept (:meth:`counted`),
    so the chunk a range becomes is not encoded again for its ``token_count``.
    """

    def __init__(self, text: str, counter: TokenCounter, max_tokens: int) -> None:
        self._text = text
        self._counter = counter
        self._max = max_tokens
        # Exact counts of the ranges counted so far: a piece's count is then the chunk's, not encoded again.
        self._counted: dict[tuple[int, int], int] = {}
        # A line of over 4 characters a budgeted token (code averages ~4) is encoded with its token boundaries,
        # kept when it is over the budget, so its token windows do not encode it again: a minified file's one
        # line took a third of its chunking time, twice. (Shorter lines: counting them costs less.)
        self._over: dict[tuple[int, int], npt.NDArray[np.int64]] = {}
        pieces = text.split("\n")
        lines = [piece + "\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] or not text else [])
        self._starts = list(accumulate(map(len, lines), initial=0))[:-1]  # each line's offset
        # Code repeats its short lines (blank lines, braces, `return`, decorators): each is counted once, and the
        # lines' counts are then looked up and summed in C, not a Python step a line.
        counts: dict[str, int] = {}
        for k, line in enumerate({line for line in lines if len(line) <= _MEMO_LINE_CHARS}):
            if not k & 0xFFF:
                checkpoint("chunking")
            counts[line] = counter.count(line)
        tokens = list(map(counts.get, lines, repeat(-1)))
        for i in compress(range(len(lines)), map(_MEMO_LINE_CHARS.__lt__, map(len, lines))):
            checkpoint("chunking")
            start, end = self._starts[i], self._starts[i] + len(lines[i])
            if len(lines[i]) > 4 * max_tokens:
                bounds = counter.encode_with_offsets(lines[i]).char_bounds
                tokens[i] = len(bounds) - 1
                if tokens[i] > max_tokens:
                    self._over[start, end] = bounds
            else:
                tokens[i] = counter.count(lines[i])
        self._prefix = list(accumulate(tokens, initial=0))

    def count(self, start: int, end: int) -> int:
        """The exact token count of ``[start, end)``, remembered."""
        tokens = self._counted.get((start, end))
        if tokens is None:
            tokens = self._counted[start, end] = self._counter.count(self._text[start:end])
        return tokens

    def counted(self, start: int, end: int) -> int | None:
        """``[start, end)``'s exact count if it was counted; else None."""
        return self._counted.get((start, end))

    def estimate(self, start: int, end: int) -> int:
        """The sum of the token counts of the lines in ``[start, end)`` (both line starts, or the text's end)."""
        return self._prefix[bisect_left(self._starts, end)] - self._prefix[bisect_left(self._starts, start)]

    def groups(self, units: Sequence[Unit]) -> list[Group]:
        """``units`` merged greedily into groups that fit, in order; a unit over the budget alone."""
        estimates = [self.estimate(u.start, u.end) for u in units]
        groups: list[Group] = []
        i = 0
        while i < len(units):
            if not i & 0xFF:
                checkpoint("chunking")
            j, total = i + 1, estimates[i]
            while j < len(units) and total + estimates[j] <= self._max:
                total += estimates[j]
                j += 1
            while j - i > 1 and self.count(units[i].start, units[j - 1].end) > self._max:
                j -= 1
            fits = j - i > 1 or self._fits(units[i].start, units[i].end, estimates[i])
            groups.append(Group(tuple(units[i:j]), fits=fits))
            i = j
        return groups

    def _fits(self, start: int, end: int, estimate: int) -> bool:
        """Whether ``[start, end)`` fits the budget; counted only when its estimate is near the budget (lines
        joined count a few tokens fewer than apart, never more in practice: ``"\\n\\n"`` is one token)."""
        return estimate <= self._max * _NEAR and self.count(start, end) <= self._max

    def split(self, unit: Unit) -> list[tuple[int, int]]:
        """Ranges covering ``unit`` (larger than the budget), each within it: at its parts when it has any,
        else at line ends."""
        if not unit.parts:
            return self.split_lines(unit.start, unit.end)
        ranges: list[tuple[int, int]] = []
        for group in self.groups(unit.parts):
            ranges.extend([(group.start, group.end)] if group.fits else self.split(group.units[0]))
        return self.merge(ranges)

    def merge(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Adjacent ``ranges`` (each within the budget) joined while they fit: the tail of a split method
        with the whole methods after it."""
        merged = ranges[:1]
        for start, end in ranges[1:]:
            first = merged[-1][0]
            joins = merged[-1][1] == start and self.estimate(first, end) <= self._max
            if joins and self.count(first, end) <= self._max:
                merged[-1] = (first, end)
            else:
                merged.append((start, end))
        return merged

    def split_lines(self, start: int, end: int) -> list[tuple[int, int]]:
        """Ranges covering ``[start, end)`` cut at line ends (see :meth:`_cut`); a line over the budget is cut
        into token windows."""
        bounds = [start, *self._starts[bisect_right(self._starts, start) : bisect_left(self._starts, end)], end]
        ranges: list[tuple[int, int]] = []
        k = 0
        while k < len(bounds) - 1:
            checkpoint("chunking")
            if self.estimate(bounds[k], bounds[k + 1]) > self._max:  # one line, counted exactly
                ranges.extend(self.token_windows(bounds[k], bounds[k + 1]))
                k += 1
                continue
            cut = self._cut(bounds, k)
            while cut - k > 1 and self.count(bounds[k], bounds[cut]) > self._max:
                cut -= 1
            ranges.append((bounds[k], bounds[cut]))
            k = cut
        return ranges

    def _cut(self, bounds: list[int], k: int) -> int:
        """Where the piece starting at ``bounds[k]`` should end: pieces of about equal size (no short tail), at
        the end of a blank line when one falls between half that size and the budget."""
        last = len(bounds) - 1
        remaining = self.estimate(bounds[k], bounds[last])
        if remaining <= self._max:
            return last
        target = remaining / -(-remaining // self._max)
        at_target: int | None = None
        blank: tuple[float, int] | None = None  # (distance to the target, cut)
        cut = k + 1
        while cut <= last and (size := self.estimate(bounds[k], bounds[cut])) <= self._max:
            if at_target is None and size >= target:
                at_target = cut
            is_blank = size * 2 >= target and not self._text[bounds[cut - 1] : bounds[cut]].strip()
            if is_blank and (blank is None or abs(size - target) <= blank[0]):
                blank = (abs(size - target), cut)
            cut += 1
        if blank is not None:
            return blank[1]
        return at_target if at_target is not None else max(cut - 1, k + 1)

    def token_windows(self, start: int, end: int) -> list[tuple[int, int]]:
        """``[start, end)`` in token windows, each window's exact count kept (:meth:`counted`)."""
        chunks = chunk_text(self._text[start:end], counter=self._counter, max_tokens=self._max, overlap_tokens=0,
                            bounds=self._over.get((start, end)))
        for c in chunks:
            self._counted[start + c.start_char, start + c.end_char] = c.token_count
        return [(start + c.start_char, start + c.end_char) for c in chunks]
