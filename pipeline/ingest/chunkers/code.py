"""Chunk source code at its definitions: whole functions and classes where they fit, split at methods where
they do not.

:func:`code_spans` cuts the text into units (:mod:`shardfuse.pipeline.ingest.chunkers.code_units`: each top-level
definition
with the comments, decorators and attributes directly above it, and the code between definitions), then
packs them in order:

- consecutive units are merged into one span while its text counts at most ``budget.max_tokens`` tokens;
- a unit larger than the budget gets spans of its own: a definition with definitions inside it (a class's
  methods) is packed again from its parts, the same way, and adjacent pieces that fit together are joined;
  anything else is cut at line ends into pieces of about equal size (after a blank line when one is near),
  and a line longer than the budget into token windows
  (:func:`shardfuse.pipeline.ingest.chunkers.token_windows.chunk_text`, no overlap).

What each span defines (``Span.symbols``):

- ``symbols``: every definition whose ``def``/header line is in the span, nested ones included, in order,
  each name once; code between definitions (imports, constants, ``if __name__ == ...``) defines nothing;
- ``primary_symbol``: the first top-level definition in the span, or for a piece of a split definition, that
  definition's name;
- ``role``: ``complete`` for one whole top-level definition with at most comments and blank lines around it,
  ``mixed`` for several whole definitions or definitions with other code, ``declaration`` for the first
  piece of a split definition, ``body`` for its later pieces, None for spans without definitions.

Python that does not parse (or has a lone ``"\\r"`` line end, which would shift :mod:`ast`'s line numbers) is
cut at line ends like any oversized unit, and its symbols are read per span by
:func:`shardfuse.pipeline.ingest.symbols.extract_symbols`.

Guarantees beyond :mod:`shardfuse.pipeline.ingest.chunkers.base`: spans never overlap; every span starts at a line
start and
ends after a ``"\\n"`` (or at the end of the text), except token windows cut from a line longer than the
budget; no span is whitespace only. Whitespace-only text gives no spans; a language without a code reader
(see :data:`shardfuse.pipeline.ingest.chunkers.code_units.LANGUAGES`) raises ValueError, even for blank text.

Cost: one syntax-tree parse or brace scan, every line counted once (the sum over a range's lines is the
estimate packing works with), and every span counted once more to check it: joined lines can count
differently from the sum of their counts.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.base import ChunkBudget, Span
from shardfuse.pipeline.ingest.chunkers.code_units import Layout, Unit, layout, require_language
from shardfuse.pipeline.ingest.chunkers.token_windows import chunk_text, newline_offsets
from shardfuse.pipeline.ingest.symbols import NO_SYMBOLS, ChunkSymbols, Role, extract_symbols

__all__ = ["code_spans"]

# A unit whose lines count up to this share of the budget is counted whole before it is declared too large.
_NEAR = 1.25
# Lines up to this long have their counts remembered (longer ones rarely repeat).
_MEMO_LINE_CHARS = 200


def code_spans(text: str, *, language: str, counter: TokenCounter, budget: ChunkBudget) -> list[Span]:
    """Spans of ``text``, source code in ``language`` (a :class:`shardfuse.pipeline.ingest.symbols.Language` value),
    cut at
    definitions and packed up to ``budget.max_tokens`` tokens each. See the module docstring."""
    require_language(language)
    if not text.strip():
        return []
    header = _file_header_end(text, language)
    if header and (header_tokens := counter.count(text[:header])) <= budget.max_tokens:
        # A file's leading comment block (licence, copyright) is a span of its own: the same text in every
        # file of a project, which the embedding cache and the entropy filter can then recognise.
        rest = code_spans(text[header:], language=language, counter=counter, budget=budget)
        return [Span(0, header, tokens=header_tokens),
                *(Span(s.start + header, s.end + header, s.heading_path, s.symbols, s.tokens) for s in rest)]
    units = layout(text, language)
    packer = _Packer(text, counter, budget.max_tokens)
    pieces: list[_Piece] = []
    for group in packer.groups(units.units):
        if group.fits:
            pieces.append(_Piece(group.start, group.end, group.units))
            continue
        (unit,) = group.units
        header = _header_at(units.definitions, unit)
        pieces.extend(_Piece(start, end, (), unit.name, start <= header) for start, end in packer.split(unit))
    return [
        Span(piece.start, piece.end, symbols=_symbols(text, piece, units, language),
             tokens=packer.counted(piece.start, piece.end))
        for piece in pieces
        if not text[piece.start : piece.end].isspace()
    ]


# Lines of a file's leading comment block that make it a header of its own.
_HEADER_MIN_LINES = 3


def _file_header_end(text: str, language: str) -> int:
    """Where the file's leading comment block ends (after its last line and the blank lines after it), when
    it has at least :data:`_HEADER_MIN_LINES` comment lines and code follows; else 0. Python comments are
    ``#`` lines (a shebang or coding line counts as one); brace languages use ``//`` lines or one ``/* */``
    block."""
    offset = lines = 0
    in_block = False
    line_comment = "#" if language == "python" else "//"
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if in_block:
            in_block = "*/" not in stripped
            lines += 1
        elif stripped.startswith(line_comment):
            lines += 1
        elif language != "python" and stripped.startswith("/*"):
            in_block = "*/" not in stripped[2:]
            lines += 1
        elif stripped and lines:
            break
        elif stripped:
            return 0
        offset += len(line)
    if in_block or lines < _HEADER_MIN_LINES or offset >= len(text) or not text[offset:].strip():
        return 0
    return offset


# Not frozen, for speed (never mutated): see markup_blocks.Block.
@dataclass(slots=True)
class _Group:
    """Consecutive units packed together; a single unit larger than the budget when ``fits`` is False."""

    units: tuple[Unit, ...]
    fits: bool

    @property
    def start(self) -> int:
        return self.units[0].start

    @property
    def end(self) -> int:
        return self.units[-1].end


@dataclass(slots=True)  # not frozen: see _Group
class _Piece:
    """One span before its symbols: whole top-level ``units``, or a piece of the split definition ``split``."""

    start: int
    end: int
    units: tuple[Unit, ...]
    split: str | None = None
    declares: bool = False  # holds the split definition's header, or comments before it


class _Packer:
    """Packs units of one text into ranges of at most ``max_tokens`` tokens.

    Every line is counted once; the sum over a range's lines is its estimate, used to choose where to cut.
    Every range it returns is then counted whole (tokens can merge or split differently across lines) and
    shrunk until it fits.
    """

    def __init__(self, text: str, counter: TokenCounter, max_tokens: int) -> None:
        self._text = text
        self._counter = counter
        self._max = max_tokens
        self._starts = [0, *(i + 1 for i in newline_offsets(text) if i + 1 < len(text))]
        self._prefix = [0]
        # Exact counts of the ranges counted so far: a piece's count is then the chunk's, not encoded again.
        self._counted: dict[tuple[int, int], int] = {}
        # Code repeats its short lines (blank lines, braces, `return`, decorators): each is encoded once.
        line_counts: dict[str, int] = {}
        for start, end in zip(self._starts, [*self._starts[1:], len(text)], strict=True):
            if not len(self._prefix) & 0xFFF:
                checkpoint("chunking")
            line = text[start:end]
            tokens = line_counts.get(line) if len(line) <= _MEMO_LINE_CHARS else None
            if tokens is None:
                tokens = counter.count(line)
                if len(line) <= _MEMO_LINE_CHARS:
                    line_counts[line] = tokens
            self._prefix.append(self._prefix[-1] + tokens)

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

    def groups(self, units: Sequence[Unit]) -> list[_Group]:
        """``units`` merged greedily into groups that fit, in order; a unit over the budget alone."""
        estimates = [self.estimate(u.start, u.end) for u in units]
        groups: list[_Group] = []
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
            groups.append(_Group(tuple(units[i:j]), fits=fits))
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
        chunks = chunk_text(self._text[start:end], counter=self._counter, max_tokens=self._max, overlap_tokens=0)
        return [(start + c.start_char, start + c.end_char) for c in chunks]


def _symbols(text: str, piece: _Piece, units: Layout, language: str) -> ChunkSymbols:
    if not units.parsed:  # no units to judge by: read the span as shardfuse.pipeline.ingest.symbols reads any chunk
        return extract_symbols(
            text[piece.start : piece.end],
            language=language,
            starts_mid_line=piece.start > 0 and text[piece.start - 1] != "\n",
            ends_document=piece.end == len(text),
        )
    names = _names_in(units.definitions, piece.start, piece.end)
    if not piece.units:  # a piece of a split unit
        if piece.split is None:  # code between definitions defines nothing
            return NO_SYMBOLS
        return ChunkSymbols(names, piece.split, Role.DECLARATION if piece.declares else Role.BODY)
    definitions = [u for u in piece.units if u.name is not None]
    if not definitions:
        return NO_SYMBOLS
    alone = len(definitions) == 1 and not any(u.code for u in piece.units if u.name is None)
    return ChunkSymbols(names, definitions[0].name, Role.COMPLETE if alone else Role.MIXED)


def _header_at(definitions: Sequence[tuple[int, str]], unit: Unit) -> int:
    """Where ``unit``'s header is: its first definition (comments and decorators come before it); pieces that
    start at or before it declare, the rest are body. -1 for filler."""
    first = bisect_left(definitions, unit.start, key=lambda d: d[0])
    return definitions[first][0] if unit.name and first < len(definitions) else -1


def _names_in(definitions: Sequence[tuple[int, str]], start: int, end: int) -> tuple[str, ...]:
    """Names of the definitions at offsets in ``[start, end)``, in order, each once."""
    low = bisect_left(definitions, start, key=lambda d: d[0])
    high = bisect_left(definitions, end, key=lambda d: d[0])
    return tuple(dict.fromkeys(name for _, name in definitions[low:high]))
