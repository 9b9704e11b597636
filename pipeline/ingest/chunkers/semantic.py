"""Semantic chunking: spans that follow a document's sections and paragraphs, within a token budget.

:func:`semantic_spans` cuts Markdown, reStructuredText, HTML and plain text where a reader would: at headings
and paragraphs (blank lines; in HTML also lines that open a block-level tag). Besides the guarantees of
:mod:`shardfuse.pipeline.ingest.chunkers.base`, for text with any non-whitespace character:

- a span is ``text[start:end]`` of whole lines (whole sentences of a line over the budget, with the headings
  right above the first of them), markup included;
  spans do not overlap, except where a single sentence over the budget is cut into overlapping token windows by
  :func:`shardfuse.pipeline.ingest.chunkers.token_windows.chunk_text`;
- blank lines go with the span before them; leading blank lines of the text belong to no span;
- a heading starts a new span. It shares that span with the deeper headings right below it and with the
  paragraphs that follow, as far as they fit: a heading is alone only when its first paragraph does not fit;
- consecutive paragraphs of one section are merged while they fit. A block over the budget is cut at blank
  lines, then at lines, then at sentence ends (a line's sentences joined again into runs of about equal size),
  then into token windows; a fenced code block (or ``<pre>``) is never cut otherwise;
- ``heading_path`` is the document title, then the headings enclosing the span's first paragraph. The title
  is ``title`` if given, else the first level-1 heading (Markdown, rST; in plain text a short first line),
  ``<title>`` or the first ``<h1>`` (HTML). A heading that became the title is not repeated after it.

The blocks (paragraphs, headings, fences) come from the format's parser in
:mod:`shardfuse.pipeline.ingest.chunkers.markup_blocks`; this module fits them to the budget and packs them.

Cost: one tokenization of the whole text (:mod:`shardfuse.pipeline.ingest.chunkers.line_tokens`), a regex pass
per line, token windows only for lines over the budget.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.base import ChunkBudget, Span
from shardfuse.pipeline.ingest.chunkers.line_tokens import LineTokens
from shardfuse.pipeline.ingest.chunkers.markup_blocks import PARSERS, Block, Heading, html_title, units_of
from shardfuse.pipeline.ingest.chunkers.token_windows import chunk_text

# The end of a sentence inside a line: its mark, closing quotes or brackets, then the spaces before the next.
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]%][.!?])[\"')\]]*[ \t]+(?=[A-Z0-9(\[\"])")


# Not frozen, for speed (never mutated): see markup_blocks.Block.
@dataclass(slots=True)
class _Piece:
    """A block, or a part of an oversize one, that fits the budget on its own."""

    start: int
    end: int
    tokens: int
    path: tuple[str, ...]
    level: int  # level of the first heading it opens; 0 if it opens none
    window: bool  # a token window: overlaps its neighbours, so it is never joined
    joint: bool  # no token crosses ``start``, so counts of pieces joined there add up exactly
    line: int  # where the line ``start`` falls in begins
    partial: bool  # sentences of a line over the budget: it starts or ends inside a line


def semantic_spans(
    text: str, *, fmt: str, counter: TokenCounter, budget: ChunkBudget, title: str | None = None
) -> list[Span]:
    """Split ``text`` of format ``fmt`` ("markdown", "rst", "html" or "text") into spans along its sections and
    paragraphs, each within ``budget.max_tokens``. See the module docstring for the guarantees.

    Whitespace-only text gives no spans; an unknown ``fmt`` raises :class:`ValueError`.
    """
    parse = PARSERS.get(fmt)
    if parse is None:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(PARSERS)}")
    if not text or text.isspace():
        return []
    doc_title, blocks = _with_title(text, fmt, parse(text), title)
    pieces = _pieces(text, blocks, tokens=LineTokens(text, counter), budget=budget, title=doc_title)
    groups = _checked(text, _pack(pieces, budget), counter=counter, budget=budget)
    return [Span(start=g[0].start, end=g[-1].end, heading_path=_group_path(g), tokens=_group_tokens(g)) for g in groups]


def _with_title(text: str, fmt: str, blocks: list[Block], title: str | None) -> tuple[str | None, list[Block]]:
    """The document's title, and the blocks with the heading that gave it (if any) left out of paths."""
    found = html_title(text) if fmt == "html" else None
    index = None if found else next((i for i, b in enumerate(blocks) if b.headings and b.headings[0][0] == 1), None)
    if index is not None:
        (level, heading), *rest = blocks[index].headings
        found = heading
        if not title or title == heading:
            blocks[index] = replace(blocks[index], headings=((level, None), *rest))
    return title or found or None, blocks


def _pieces(text: str, blocks: list[Block], *, tokens: LineTokens, budget: ChunkBudget,
            title: str | None) -> list[_Piece]:
    """Every block as pieces within the budget, each with the heading path it sits under. A block's range runs
    to the next block's start, so blank lines go with the block before them."""
    root: tuple[str, ...] = (title,) if title else ()
    outline: list[Heading] = []
    path = root
    pieces: list[_Piece] = []
    marks = tokens.marks([*(b.start for b in blocks), len(text)])
    for i, block in enumerate(blocks):
        if not i & 0xFF:
            checkpoint("chunking")
        for level, heading in block.headings:
            while outline and outline[-1][0] >= level:
                outline.pop()
            outline.append((level, heading))
        if block.headings:
            path = root + tuple(h for _, h in outline if h)
        end = blocks[i + 1].start if i + 1 < len(blocks) else len(text)
        (joint, first), (_, last) = marks[i], marks[i + 1]
        count = tokens.count(block.start, end) if first is None or last is None else last - first
        if count <= budget.max_tokens:  # most blocks: one piece, without _fit's call, list and line search
            # A block is whole lines: it starts a line and runs to the next block's start (a line's) or the
            # text's end, so the piece is its line's start and not partial.
            level = block.headings[0][0] if block.headings else 0
            pieces.append(_Piece(block.start, end, count, path, level, False, joint, block.start, False))
            continue
        fitted = _fit(text, block.start, end, tokens, budget, count)
        for k, (s, e, n, window) in enumerate(fitted):
            level = block.headings[0][0] if block.headings and k == 0 else 0
            line = text.rfind("\n", 0, s) + 1
            partial = s != line or not (e == len(text) or text[e - 1] == "\n" or text[e] in "\r\n")
            clean = joint if s == block.start else tokens.clean(s)
            pieces.append(_Piece(s, e, n, path, level, window, clean, line, partial))
    return pieces


def _fit(text: str, start: int, end: int, tokens: LineTokens, budget: ChunkBudget,
         count: int | None = None) -> list[tuple[int, int, int, bool]]:
    """``text[start:end]`` as ``(start, end, tokens, is_window)`` parts within the budget: itself if it fits,
    else cut at blank lines, else at lines, else (a single line) at sentence ends, else into token windows
    (``count``: its tokens, if known)."""
    count = tokens.count(start, end) if count is None else count
    if count <= budget.max_tokens:
        return [(start, end, count, False)]
    units = units_of(text, start, end, paragraphs=True)
    if len(units) == 1:
        units = units_of(text, start, end, paragraphs=False)
    if len(units) > 1:
        ends = [s for s, _ in units[1:]] + [end]
        return [part for (s, _), e in zip(units, ends, strict=True) for part in _fit(text, s, e, tokens, budget)]
    sentences = _sentences(text, start, end)
    if len(sentences) > 1:
        return _balanced([part for s, e in sentences for part in _fit(text, s, e, tokens, budget)], tokens, budget)
    windows = chunk_text(text[start:end], counter=tokens.counter, max_tokens=budget.max_tokens,
                         overlap_tokens=budget.overlap_tokens, bounds=tokens.bounds_within(start, end))
    return [(start + w.start_char, start + w.end_char, w.token_count, True) for w in windows]


def _balanced(parts: list[tuple[int, int, int, bool]], tokens: LineTokens,
              budget: ChunkBudget) -> list[tuple[int, int, int, bool]]:
    """The sentences of one line (``parts``, token windows for a sentence over the budget) joined into runs of
    about equal size: as few as the budget allows. Greedy filling would leave a short last run (a line of 1.1
    budgets gives 1 and 0.1), a chunk too small to rank well in either leg."""
    joined: list[tuple[int, int, int, bool]] = []
    run: list[tuple[int, int, int, bool]] = []
    for part in [*parts, (0, 0, 0, True)]:  # a window (and the sentinel) ends a run of sentences
        if not part[3]:
            run.append(part)
            continue
        total = sum(n for _, _, n, _ in run)
        groups = math.ceil(total / budget.max_tokens)
        target = total / max(groups, 1)
        group: list[tuple[int, int, int, bool]] = []
        size = 0
        for sentence in run:
            if group and (size + sentence[2] > budget.max_tokens or size + sentence[2] / 2 > target):
                joined.extend(_joined(group, tokens, budget))
                group, size = [], 0
            group.append(sentence)
            size += sentence[2]
        joined.extend(_joined(group, tokens, budget))
        run = []
        if part[1] > part[0]:
            joined.append(part)
    return joined


def _joined(group: list[tuple[int, int, int, bool]], tokens: LineTokens,
            budget: ChunkBudget) -> list[tuple[int, int, int, bool]]:
    """``group`` (consecutive sentences) as one part, counted whole; as it was if a token crossing a joint
    takes the count over the budget."""
    if len(group) < 2:
        return group
    start, end = group[0][0], group[-1][1]
    count = tokens.count(start, end)
    return [(start, end, count, False)] if count <= budget.max_tokens else group


def _sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """``text[start:end]`` (one line) cut after each sentence: at ``.``, ``!`` or ``?`` (and any closing quotes or
    brackets) followed by spaces and a capital, a digit or an opening bracket. Each part runs to the next one's
    start, so the spaces between sentences go with the sentence before them."""
    starts = [start, *(m.end() for m in _SENTENCE_END.finditer(text, start, end))]
    return [(s, e) for s, e in zip(starts, [*starts[1:], end], strict=True) if s < e]


def _pack(pieces: list[_Piece], budget: ChunkBudget) -> list[list[_Piece]]:
    """Consecutive pieces joined greedily into groups whose summed count fits the budget."""
    groups: list[list[_Piece]] = []
    count = 0
    for piece in pieces:
        if groups and _joinable(groups[-1][-1], piece) and count + piece.tokens <= budget.max_tokens:
            groups[-1].append(piece)
            count += piece.tokens
        else:
            groups.append([piece])
            count = piece.tokens
    return groups


def _joinable(last: _Piece, piece: _Piece) -> bool:
    """Whether ``piece`` may join the group ending with ``last``. Token windows stand alone. A heading starts a
    new group, unless the group holds only higher headings (a heading joins only heading-only groups, so a
    heading ``last`` means the whole group is headings). Sentences of a cut line join only each other and the
    headings right above them, so a span of several lines is whole lines but for a cut line's sentences
    after its headings."""
    if piece.window or last.window:
        return False
    if (piece.partial or last.partial) and piece.line != last.line:
        return last.level > 0 and not piece.level
    return not piece.level or 0 < last.level < piece.level


def _checked(
    text: str, groups: list[list[_Piece]], *, counter: TokenCounter, budget: ChunkBudget
) -> Iterator[list[_Piece]]:
    """The groups, each cut before its last pieces until it fits where a token crosses a joint (so the summed
    count may be off). Never needed for cl100k or o200k text whose lines end in ``"\\n"`` or ``"\\r\\n"``."""
    for group in groups:
        while group:
            size = len(group)
            if not all(p.joint for p in group[1:]):
                while size > 1 and counter.count(text[group[0].start : group[size - 1].end]) > budget.max_tokens:
                    size -= 1
            yield group[:size]
            group = group[size:]


def _group_tokens(group: list[_Piece]) -> int | None:
    """The group's exact token count when its pieces' counts add up (no token crosses a joint), else None."""
    if len(group) == 1:
        return group[0].tokens
    return sum(p.tokens for p in group) if all(p.joint for p in group[1:]) else None


def _group_path(group: list[_Piece]) -> tuple[str, ...]:
    """The path of a group's first paragraph: it follows the group's leading headings, if any."""
    return next((p.path for p in group if not p.level), group[-1].path)
