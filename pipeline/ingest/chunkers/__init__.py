"""Chunking strategies, chosen per document by type, and the chunks they make.

Strategies (each a pure function of the text, see :mod:`shardfuse.pipeline.ingest.chunkers.base` for what every one
guarantees):

- ``fixed``: token windows of ``max_tokens`` without overlap;
- ``overlapping``: token windows overlapping by ``overlap_tokens``
(:mod:`shardfuse.pipeline.ingest.chunkers.token_windows`);
- ``semantic``: section and paragraph boundaries of Markdown, reStructuredText, HTML and plain text, small
  pieces merged and large ones split to the budget, each chunk with its heading path
  (:mod:`shardfuse.pipeline.ingest.chunkers.semantic`);
- ``code``: top-level definitions (Python by its syntax tree, brace languages by their headers and braces),
  each chunk with its primary symbol, all symbols and role (:mod:`shardfuse.pipeline.ingest.chunkers.code`).

``chunking.strategies`` maps a file extension (``".md"``), ``"code"`` (any language
:func:`shardfuse.pipeline.ingest.symbols.language_for` knows) and ``"*"`` (everything else) to a strategy.
"""

from __future__ import annotations

import dataclasses
import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence

from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.base import ChunkBudget, Span
from shardfuse.pipeline.ingest.chunkers.code import code_spans
from shardfuse.pipeline.ingest.chunkers.semantic import semantic_spans
from shardfuse.pipeline.ingest.chunkers.token_windows import chunk_text
from shardfuse.pipeline.ingest.symbols import NO_SYMBOLS, extract_symbols, language_for, with_lines

__all__ = ["STRATEGIES", "ChunkBudget", "Span", "chunk_document", "materialize", "strategy_for"]

_NEWLINE = re.compile("\n")
STRATEGIES = ("fixed", "overlapping", "semantic", "code")
# The semantic strategy's reading of each extension; anything else is plain text.
_SEMANTIC_FORMATS: Mapping[str, str] = {
    ".md": "markdown", ".markdown": "markdown", ".mdx": "markdown", ".rst": "rst", ".rest": "rst",
    ".html": "html", ".htm": "html", ".xhtml": "html",
}  # fmt: skip


def _extension(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def strategy_for(path: str, strategies: Mapping[str, str]) -> str:
    """The strategy for a document: its extension's entry, else ``"code"``'s for source code, else ``"*"``'s."""
    extension = _extension(path)
    if extension in strategies:
        return strategies[extension]
    if language_for(path) is not None and "code" in strategies:
        return strategies["code"]
    return strategies.get("*", "overlapping")


def chunk_document(
    text: str, *, path: str, counter: TokenCounter, budget: ChunkBudget, strategies: Mapping[str, str]
) -> list[Chunk]:
    """The chunks of one decoded document, by the strategy its type maps to."""
    strategy = strategy_for(path, strategies)
    language = language_for(path)
    if strategy == "code" and language is not None:
        spans = code_spans(text, language=language, counter=counter, budget=budget)
    elif strategy == "semantic":
        spans = semantic_spans(
            text, fmt=_SEMANTIC_FORMATS.get(_extension(path), "text"), counter=counter, budget=budget
        )
    elif strategy in ("fixed", "overlapping", "code"):  # "code" for a file no code chunker reads
        overlap = budget.overlap_tokens if strategy == "overlapping" else 0
        spans = window_spans(text, counter=counter, max_tokens=budget.max_tokens, overlap_tokens=overlap)
    else:
        raise ValueError(f"unknown chunking strategy {strategy!r} for {path}; use one of {', '.join(STRATEGIES)}")
    return materialize(text, spans, counter=counter, language=language, read_symbols=strategy != "code")


def window_spans(text: str, *, counter: TokenCounter, max_tokens: int, overlap_tokens: int) -> list[Span]:
    """Token windows (``fixed`` when ``overlap_tokens`` is 0, else ``overlapping``) as spans."""
    chunks = chunk_text(text, counter=counter, max_tokens=max_tokens, overlap_tokens=overlap_tokens)
    return [Span(c.start_char, c.end_char, tokens=c.token_count) for c in chunks]


def materialize(
    text: str, spans: Sequence[Span], *, counter: TokenCounter, language: str | None, read_symbols: bool = True
) -> list[Chunk]:
    """Chunks from spans: text slices, 1-based inclusive line numbers (binary search over the newline
    offsets, computed once), token counts (the span's own when its strategy knew it), ordinals. With
    ``read_symbols``, a span of a code file that came without symbols (a window strategy) gets them from
    :func:`shardfuse.pipeline.ingest.symbols.extract_symbols`; the code strategy's spans carry their own."""
    newlines = [m.start() for m in _NEWLINE.finditer(text)]
    chunks = []
    for ordinal, span in enumerate(spans):
        if not ordinal & 0xFF:
            checkpoint("chunking")
        piece = text[span.start : span.end]
        symbols = span.symbols
        mid_line, last = span.start > 0 and text[span.start - 1] != "\n", span.end == len(text)
        if read_symbols and language is not None and symbols is NO_SYMBOLS:
            symbols = extract_symbols(piece, language=language, starts_mid_line=mid_line, ends_document=last)
        elif language is not None:  # the code strategy's definitions, with their lines (search's symbol ranges)
            symbols = with_lines(symbols, piece, language=language, starts_mid_line=mid_line, ends_document=last)
        chunks.append(
            Chunk(
                ordinal=ordinal,
                text=piece,
                start_char=span.start,
                end_char=span.end,
                start_line=bisect_right(newlines, span.start - 1) + 1,
                end_line=bisect_right(newlines, span.end - 2) + 1 if span.end > span.start else 1,
                token_count=counter.count(piece) if span.tokens is None else span.tokens,
                symbols=symbols,
                language=language,
                heading_path=span.heading_path,
            )
        )
    return chunks


def renumbered(chunks: Sequence[Chunk]) -> list[Chunk]:
    """``chunks`` with ordinals 0, 1, 2 … (after a filter dropped some)."""
    return [c if c.ordinal == i else dataclasses.replace(c, ordinal=i) for i, c in enumerate(chunks)]
