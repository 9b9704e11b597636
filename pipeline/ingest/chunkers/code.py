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

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.base import ChunkBudget, Span
from shardfuse.pipeline.ingest.chunkers.code_packing import Packer
from shardfuse.pipeline.ingest.chunkers.code_units import Layout, Unit, layout, require_language
from shardfuse.pipeline.ingest.symbols import NO_SYMBOLS, ChunkSymbols, Role, extract_symbols

__all__ = ["code_spans"]


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
    packer = Packer(text, counter, budget.max_tokens)
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


@dataclass(slots=True)  # not frozen: see markup_blocks.Block
class _Piece:
    """One span before its symbols: whole top-level ``units``, or a piece of the split definition ``split``."""

    start: int
    end: int
    units: tuple[Unit, ...]
    split: str | None = None
    declares: bool = False  # holds the split definition's header, or comments before it


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
