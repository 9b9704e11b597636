"""What every chunking strategy returns: spans of the document's text, and the budget they respect.

A strategy is a pure function ``text → list[Span]``. Spans index the decoded text (``text[start:end]`` is
the chunk); :func:`shardfuse.pipeline.ingest.chunkers.materialize` turns them into
:class:`~shardfuse.pipeline.core.documents.Chunk` objects
(line numbers by binary search over newline offsets, token counts, ordinals). Every strategy guarantees,
for non-empty text:

- spans are in order and non-empty: ``0 <= start < end <= len(text)``; each starts after the previous one
  starts (overlap only where the strategy overlaps on purpose);
- together they cover every non-whitespace character of the text;
- each span's text counts at most ``budget.max_tokens`` tokens, except a single unbreakable token run
  (never happens with tiktoken: any span can be cut at token boundaries).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardfuse.pipeline.ingest.symbols import NO_SYMBOLS, ChunkSymbols


@dataclass(frozen=True, slots=True)
class ChunkBudget:
    """Token budget of one chunk, and the overlap of consecutive windows where a strategy overlaps."""

    max_tokens: int = 512
    overlap_tokens: int = 64

    def __post_init__(self) -> None:
        if self.max_tokens < 16:
            raise ValueError(f"max_tokens must be at least 16, got {self.max_tokens}")
        if not 0 <= self.overlap_tokens < self.max_tokens:
            raise ValueError(f"overlap_tokens must be in [0, max_tokens), got {self.overlap_tokens}")


@dataclass(frozen=True, slots=True)
class Span:
    """One chunk as a strategy chose it.

    ``heading_path`` is where the span sits in the document's outline (title > section > subsection) for
    formats that have one; ``symbols`` is what a code span defines (primary symbol, all symbols, role).
    ``tokens`` is ``counter.count(text[start:end])`` when the strategy already knows it exactly (so the chunk is
    not encoded again for its count); None when it does not.
    """

    start: int
    end: int
    heading_path: tuple[str, ...] = ()
    symbols: ChunkSymbols = NO_SYMBOLS
    tokens: int | None = None
