"""Semantic chunking: spans that follow a document's sections and paragraphs, within a token budget.

:func:`semantic_spans` cuts Markdown, reStructuredText, HTML and plain text where a reader would: at headings
and paragraphs (blank lines; in HTML also lines that open a block-level tag). Besides the guarantees of
:mod:`shardfuse.pipeline.ingest.chunkers.base`, for text with any non-whitespace character:

- a span is ``text[start:end]`` of whole lines, markup included; spans do not overlap, except where a single
  line over the budget is cut into overlapping token windows by
  :func:`shardfuse.pipeline.ingest.chunkers.token_windows.chunk_text`;
- blank lines go with the span before them; leading blank lines of the text belong to no span;
- a heading starts a new span. It shares that span with the deeper headings right below it and with the
  paragraphs that follow, as far as they fit: a heading is alone only when its first paragraph does not fit;
- consecutive paragraphs of one section are merged while they fit. A block over the budget is cut at blank
  lines, then at lines, then into token windows; a fenced code block (or ``<pre>``) is never cut otherwise;
- ``heading_path`` is the document title, then the headings enclosing the span's first paragraph. The title
  is ``title`` if given, else the first level-1 heading (Markdown, rST), ``<title>`` or the first ``<h1>``
  (HTML). A heading that became the title is not repeated after it.

Cost: one tokenization of the whole text (see :class:`_Tokens`), a regex pass per line, token windows only
for lines over the budget.
"""

from __future__ import annotations

import html
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.base import ChunkBudget, Span
from shardfuse.pipeline.ingest.chunkers.token_windows import chunk_text

# Level (1 is highest) and text of a heading; a None text is the title's heading, left out of paths.
_Heading = tuple[int, str | None]

_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*))?$")
_ATX_CLOSING = re.compile(r"(?:^|[ \t]+)#+$")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)$")
_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*$")
# A paragraph starting like this is a list, quote or table: a "---" below it is a rule, not an underline.
_NOT_SETEXT = re.compile(r" {0,3}(?:[-*+>]\s|\d{1,9}[.)]\s|\|)")
_FRONT_MATTER = re.compile(r"(---|\+\+\+)[ \t]*\r?\n.{0,20000}?^(?:\1|\.\.\.)[ \t]*\r?$", re.S | re.M)
_RST_ADORNMENT = re.compile(r"([=\-~^\"'`#*+])\1*$")
_HTML_BLOCK_TAGS = (
    "address|article|aside|blockquote|body|caption|dd|details|dialog|div|dl|dt|fieldset|figcaption|figure|"
    "footer|form|h[1-6]|head|header|hr|html|li|main|nav|ol|p|pre|section|summary|table|tbody|td|tfoot|th|"
    "thead|title|tr|ul"
)
_HTML_BLOCK_LINE = re.compile(rf"^[ \t]*<(?:{_HTML_BLOCK_TAGS})\b", re.I | re.M)
# Never cut inside these; headings inside them do not count. Unclosed, they run to the end.
_HTML_RAW = re.compile(r"<!--.*?(?:-->|\Z)|<(pre|script|style|textarea)\b[^>]*>.*?(?:</\1\s*>|\Z)", re.I | re.S)
# Bounded, so that many unclosed headings cannot make the scan quadratic.
_HTML_HEADING = re.compile(r"<h([1-6])\b[^>]*>(.{0,4000}?)</h\1\s*>", re.I | re.S)
_HTML_TITLE = re.compile(r"<title\b[^>]*>(.{0,4000}?)</title\s*>", re.I | re.S)
_HTML_TAG = re.compile(r"<[^>]*>")
_BREAK_AFTER_INDENT = re.compile(r"[^\S\r\n]*[\r\n]")
# Encodings whose pre-split takes a run of line breaks up to its last "\n" (``\s*[\r\n]+``), see _Tokens.
_LINE_AWARE_ENCODINGS = frozenset({"cl100k_base", "o200k_base"})


@dataclass(frozen=True, slots=True)
class _Block:
    """Whole non-blank lines ``text[start:end]`` (without the last ``"\\n"``) that belong together, and the
    headings they open, in order."""

    start: int
    end: int
    headings: tuple[_Heading, ...] = ()


@dataclass(frozen=True, slots=True)
class _Piece:
    """A block, or a part of an oversize one, that fits the budget on its own."""

    start: int
    end: int
    tokens: int
    path: tuple[str, ...]
    level: int  # level of the first heading it opens; 0 if it opens none
    window: bool  # a token window: overlaps its neighbours, so it is never joined
    joint: bool  # no token crosses ``start``, so counts of pieces joined there add up exactly


class _Tokens:
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
        self._bounds: list[int] = counter.encode_with_offsets(text).char_bounds.tolist() if self._line_aware else []

    def count(self, start: int, end: int) -> int:
        """The number of tokens of ``text[start:end]``, as :meth:`TokenCounter.count` gives it."""
        first, last = self._boundary(start), self._boundary(end)
        if first is None or last is None:
            return self.counter.count(self._text[start:end])
        return last - first

    def clean(self, pos: int) -> bool:
        """Whether no token of the text can cross ``pos`` (see the class docstring)."""
        if pos in (0, len(self._text)):
            return True
        return self._line_aware and self._text[pos - 1] == "\n" and not _BREAK_AFTER_INDENT.match(self._text, pos)

    def _boundary(self, pos: int) -> int | None:
        """The index of the token boundary at ``pos`` if ``pos`` is clean, else None."""
        i = bisect_left(self._bounds, pos)
        return i if self.clean(pos) and i < len(self._bounds) and self._bounds[i] == pos else None


def semantic_spans(
    text: str, *, fmt: str, counter: TokenCounter, budget: ChunkBudget, title: str | None = None
) -> list[Span]:
    """Split ``text`` of format ``fmt`` ("markdown", "rst", "html" or "text") into spans along its sections and
    paragraphs, each within ``budget.max_tokens``. See the module docstring for the guarantees.

    Whitespace-only text gives no spans; an unknown ``fmt`` raises :class:`ValueError`.
    """
    parse = _PARSERS.get(fmt)
    if parse is None:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(_PARSERS)}")
    if not text or text.isspace():
        return []
    doc_title, blocks = _with_title(text, fmt, parse(text), title)
    pieces = _pieces(text, blocks, tokens=_Tokens(text, counter), budget=budget, title=doc_title)
    groups = _checked(text, _pack(pieces, budget), counter=counter, budget=budget)
    return [Span(start=g[0].start, end=g[-1].end, heading_path=_group_path(g)) for g in groups]


def _with_title(text: str, fmt: str, blocks: list[_Block], title: str | None) -> tuple[str | None, list[_Block]]:
    """The document's title, and the blocks with the heading that gave it (if any) left out of paths."""
    tag = _HTML_TITLE.search(text) if fmt == "html" else None
    found = _html_text(tag.group(1)) if tag else None
    index = None if found else next((i for i, b in enumerate(blocks) if b.headings and b.headings[0][0] == 1), None)
    if index is not None:
        (level, heading), *rest = blocks[index].headings
        found = heading
        if not title or title == heading:
            blocks[index] = replace(blocks[index], headings=((level, None), *rest))
    return title or found or None, blocks


def _pieces(
    text: str, blocks: list[_Block], *, tokens: _Tokens, budget: ChunkBudget, title: str | None
) -> list[_Piece]:
    """Every block as pieces within the budget, each with the heading path it sits under. A block's range runs
    to the next block's start, so blank lines go with the block before them."""
    root: tuple[str, ...] = (title,) if title else ()
    outline: list[_Heading] = []
    path = root
    pieces: list[_Piece] = []
    for i, block in enumerate(blocks):
        for level, heading in block.headings:
            while outline and outline[-1][0] >= level:
                outline.pop()
            outline.append((level, heading))
        if block.headings:
            path = root + tuple(h for _, h in outline if h)
        end = blocks[i + 1].start if i + 1 < len(blocks) else len(text)
        for k, (s, e, n, window) in enumerate(_fit(text, block.start, end, tokens, budget)):
            level = block.headings[0][0] if block.headings and k == 0 else 0
            pieces.append(_Piece(s, e, n, path, level, window, tokens.clean(s)))
    return pieces


def _fit(text: str, start: int, end: int, tokens: _Tokens, budget: ChunkBudget) -> list[tuple[int, int, int, bool]]:
    """``text[start:end]`` as ``(start, end, tokens, is_window)`` parts within the budget: itself if it fits,
    else cut at blank lines, else at lines, else (a single line) into token windows."""
    count = tokens.count(start, end)
    if count <= budget.max_tokens:
        return [(start, end, count, False)]
    units = _units(text, start, end, paragraphs=True)
    if len(units) == 1:
        units = _units(text, start, end, paragraphs=False)
    if len(units) > 1:
        ends = [s for s, _ in units[1:]] + [end]
        return [part for (s, _), e in zip(units, ends, strict=True) for part in _fit(text, s, e, tokens, budget)]
    windows = chunk_text(
        text[start:end], counter=tokens.counter, max_tokens=budget.max_tokens, overlap_tokens=budget.overlap_tokens
    )
    return [(start + w.start_char, start + w.end_char, w.token_count, True) for w in windows]


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
    heading ``last`` means the whole group is headings)."""
    if piece.window or last.window:
        return False
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


def _group_path(group: list[_Piece]) -> tuple[str, ...]:
    """The path of a group's first paragraph: it follows the group's leading headings, if any."""
    return next((p.path for p in group if not p.level), group[-1].path)


def _lines(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of every line of ``text[start:end]``, without its ``"\\n"``."""
    while start < end:
        stop = text.find("\n", start, end)
        stop = end if stop == -1 else stop
        yield start, stop
        start = stop + 1


def _blank(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is empty or whitespace."""
    return start == end or text[start:end].isspace()


def _units(text: str, start: int, end: int, *, paragraphs: bool) -> list[tuple[int, int]]:
    """The paragraphs (runs of non-blank lines) of ``text[start:end]``, or else its non-blank lines."""
    units: list[tuple[int, int]] = []
    after_blank = True
    for s, e in _lines(text, start, end):
        if _blank(text, s, e):
            after_blank = True
        elif paragraphs and not after_blank:
            units[-1] = (units[-1][0], e)
        else:
            units.append((s, e))
            after_blank = False
    return units


def _parse_text(text: str) -> list[_Block]:
    """Plain text: paragraphs, no headings."""
    return [_Block(s, e) for s, e in _units(text, 0, len(text), paragraphs=True)]


def _parse_markdown(text: str) -> list[_Block]:
    """Markdown: ATX and setext headings, fenced code blocks (kept whole, headings inside ignored), paragraphs,
    and a leading YAML/TOML front matter as one block."""
    front = _FRONT_MATTER.match(text)
    blocks = [_Block(0, front.end())] if front else []
    para: tuple[int, int, bool] | None = None  # open paragraph: start, end, whether an underline may follow
    fence: tuple[re.Pattern[str], int] | None = None  # open fence: its closing line, its start
    for start, end in _lines(text, front.end() if front else 0, len(text)):
        line = text[start:end].rstrip()
        if fence is not None:
            if fence[0].match(line):
                blocks.append(_Block(fence[1], end))
                fence = None
            continue
        underline = _SETEXT.match(line) if para and para[2] else None
        if underline and para:
            level = 1 if underline.group(1)[0] == "=" else 2
            blocks.append(_Block(para[0], end, ((level, " ".join(text[para[0] : para[1]].split())),)))
            para = None
            continue
        atx, opening = _ATX.match(line), _FENCE.match(line)
        opening = opening if opening and not (opening.group(1)[0] == "`" and "`" in opening.group(2)) else None
        if not line or atx or opening:
            blocks.extend([_Block(para[0], para[1])] if para else [])
            para = None
        if atx:
            heading = _ATX_CLOSING.sub("", (atx.group(2) or "").strip()).strip()
            blocks.append(_Block(start, end, ((len(atx.group(1)), heading),)))
        elif opening:
            marker = opening.group(1)
            fence = (re.compile(rf" {{0,3}}{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$"), start)
        elif line:
            para = (para[0], end, para[2]) if para else (start, end, not _NOT_SETEXT.match(line))
    if para:
        blocks.append(_Block(para[0], para[1]))
    if fence:
        blocks.append(_Block(fence[1], len(text)))
    return blocks


def _parse_rst(text: str) -> list[_Block]:
    """reStructuredText: section titles (levels in order of first appearance of each adornment style, as
    docutils assigns them) and paragraphs."""
    lines = list(_lines(text, 0, len(text)))
    rows = [text[s:e].rstrip() for s, e in lines]
    styles: list[tuple[str, bool]] = []
    blocks: list[_Block] = []
    para: tuple[int, int] | None = None
    i = 0
    while i < len(lines):
        start, end = lines[i]
        blank = not rows[i].strip()
        found = None if para or blank else _rst_title(rows, i)
        if found:
            used, heading, style = found
            if style not in styles:
                styles.append(style)
            blocks.append(_Block(start, lines[i + used - 1][1], ((styles.index(style) + 1, heading),)))
            i += used
            continue
        if blank and para:
            blocks.append(_Block(*para))
        para = None if blank else (para[0] if para else start, end)
        i += 1
    blocks.extend([_Block(*para)] if para else [])
    return blocks


def _rst_title(rows: list[str], i: int) -> tuple[int, str, tuple[str, bool]] | None:
    """The section title starting at ``rows[i]`` (lines without trailing whitespace): the lines it spans, its
    text and its adornment style (character, whether overlined); or None."""
    first, second, third = (rows[k] if k < len(rows) else "" for k in (i, i + 1, i + 2))
    if _RST_ADORNMENT.match(first):
        title = second.strip()
        fits = title and not _RST_ADORNMENT.match(second) and len(first) >= len(title)
        return (3, title, (first[0], True)) if fits and third == first else None
    if first and not first[0].isspace() and _RST_ADORNMENT.match(second) and len(second) >= len(first):
        return 2, first.strip(), (second[0], False)
    return None


def _parse_html(text: str) -> list[_Block]:
    """HTML: blocks start at blank lines and at lines that open a block-level tag; ``<pre>``, ``<script>``,
    ``<style>``, ``<textarea>`` and comments are kept whole. Headings are ``<h1>``..``<h6>``."""
    raw = [m.span() for m in _HTML_RAW.finditer(text)]
    raw_starts = [s for s, _ in raw]
    opens = {m.start() for m in _HTML_BLOCK_LINE.finditer(text)}
    spans: list[tuple[int, int]] = []
    for start, end in _lines(text, 0, len(text)):
        if spans and _inside(raw, raw_starts, start):
            spans[-1] = (spans[-1][0], end)
        elif _blank(text, start, end):
            continue
        elif spans and start not in opens and spans[-1][1] == start - 1:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    headings: dict[int, list[_Heading]] = {}
    starts = [s for s, _ in spans]
    for m in _HTML_HEADING.finditer(text):
        if not _inside(raw, raw_starts, m.start()):
            headings.setdefault(bisect_right(starts, m.start()) - 1, []).append((int(m.group(1)), _html_text(m[2])))
    return [_Block(s, e, tuple(headings.get(i, ()))) for i, (s, e) in enumerate(spans)]


def _inside(raw: list[tuple[int, int]], raw_starts: list[int], pos: int) -> bool:
    """Whether ``pos`` lies after the start of one of the ``raw`` ranges and before its end."""
    i = bisect_right(raw_starts, pos) - 1
    return i >= 0 and raw[i][0] < pos < raw[i][1]


def _html_text(fragment: str) -> str:
    """The text of an HTML fragment: tags dropped, entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(_HTML_TAG.sub("", fragment)).split())


_PARSERS: dict[str, Callable[[str], list[_Block]]] = {
    "markdown": _parse_markdown,
    "rst": _parse_rst,
    "html": _parse_html,
    "text": _parse_text,
}
