"""The ``headings`` context: a chunk situated by what the document already says about where it sits.

Free and deterministic: the document's path, its outline position (title > section > subsection) and, for
code, the language and the symbol the chunk defines. For example::

    docs/architecture.md — shardfuse architecture > Shards > How a document's chunks are replaced atomically
    pipeline/ingest/chunkers/token_windows.py — python: chunk_text (complete definition)
    pipeline/index/store/shard_store.py — python: ShardStore (continued), defines apply, _replace

The context is embedded and BM25-indexed in front of the chunk
(:attr:`shardfuse.pipeline.core.documents.Chunk.indexed_text`);
search results show the chunk alone. A long heading path keeps its first and last headings and elides the
middle so that the context stays within ``max_chars``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from shardfuse.pipeline.core.documents import Chunk, ContextSource
from shardfuse.pipeline.ingest.symbols import ChunkSymbols, Role

# About 100 tokens of English.
MAX_CHARS = 400
# What may surround a heading's words at the start of a chunk: Markdown's #, rST's adornments, blank lines.
_HEADING_MARKUP = "#=-~^*+ \t\r\n"

_ROLE_WORDS = {
    Role.COMPLETE: "complete definition",
    Role.DECLARATION: "start of the definition",
    Role.BODY: "continued",
    Role.MIXED: "several definitions",
}


def headings_context(
    *, path: str, heading_path: Sequence[str], symbols: ChunkSymbols, language: str | None, max_chars: int = MAX_CHARS,
    text: str = "",
) -> str:
    """The context line of one chunk (see the module docstring). Headings that ``text`` (the chunk) opens
    with are left out: the chunk already says them, and the context is for what it does not say."""
    parts: list[str] = []
    heading_path = heading_path[_opening_headings(text, heading_path):]
    if heading_path:
        parts.append(_outline(heading_path, budget=max(40, max_chars - len(path) - 3)))
    code = _code(symbols, language)
    if code:
        parts.append(code)
    context = f"{path} — {'; '.join(parts)}" if parts else path
    return context if len(context) <= max_chars else context[: max_chars - 1] + "…"


def with_headings_context(path: str, chunks: Sequence[Chunk]) -> list[Chunk]:
    """``chunks`` each with its headings context (source ``headings``)."""
    return [
        replace(
            chunk,
            context=headings_context(path=path, heading_path=chunk.heading_path, symbols=chunk.symbols,
                                     language=chunk.language, text=chunk.text),
            context_source=ContextSource.HEADINGS,
        )
        for chunk in chunks
    ]


def _opening_headings(text: str, heading_path: Sequence[str]) -> int:
    """How many of ``heading_path``'s first headings ``text`` opens with, in order (markup around them aside)."""
    rest = text.lstrip(_HEADING_MARKUP)
    count = 0
    for heading in heading_path:
        line, _, after = rest.partition("\n")
        # A Markdown closing sequence ("## Install ##") is not part of the heading.
        if not heading.split() or line.rstrip(" \t#\r").split() != heading.split():
            break
        rest = after.lstrip(_HEADING_MARKUP)
        count += 1
    return count


def _outline(headings: Sequence[str], *, budget: int) -> str:
    cleaned = [" ".join(h.split()) for h in headings if h and h.strip()]
    outline = " > ".join(cleaned)
    if len(outline) <= budget or len(cleaned) <= 2:
        return outline
    # Keep the title and the innermost heading; drop middle levels until it fits.
    head, tail = cleaned[:1], cleaned[-1:]
    middle = cleaned[1:-1]
    while middle and len(" > ".join([*head, "…", *middle, *tail])) > budget:
        middle.pop(0)
    return " > ".join([*head, "…", *middle, *tail])


def _code(symbols: ChunkSymbols, language: str | None) -> str:
    if language is None or not (symbols.symbols or symbols.primary_symbol):
        return ""
    text = f"{language}:"
    if symbols.primary_symbol:
        text += f" {symbols.primary_symbol}"
        if symbols.role is not None:
            text += f" ({_ROLE_WORDS[symbols.role]})"
    others = [s for s in symbols.symbols if s != symbols.primary_symbol]
    if others:
        shown = others[:8]
        more = f" and {len(others) - len(shown)} more" if len(others) > len(shown) else ""
        text += (", defines " if symbols.primary_symbol else " defines ") + ", ".join(shown) + more
    return text
