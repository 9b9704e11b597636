"""The blocks of a document's markup that semantic chunking cuts along (:mod:`.semantic`).

One parser per format turns the text into :class:`Block` s: whole non-blank lines that belong together
(a paragraph, a heading, a fenced code block, front matter, an HTML block) and the headings each opens.

- Markdown: ATX and setext headings, fenced code blocks (kept whole, headings inside ignored), paragraphs,
  and a leading YAML/TOML front matter as one block;
- reStructuredText: section titles, leveled in order of first appearance of each adornment style (as docutils
  does), and paragraphs;
- HTML: blocks start at blank lines and at lines that open a block-level tag; ``<pre>``, ``<script>``,
  ``<style>``, ``<textarea>`` and comments are kept whole; headings are ``<h1>`` .. ``<h6>``;
- plain text: paragraphs; a first paragraph that is one short line is the title (a level-1 heading).
"""

from __future__ import annotations

import functools
import html
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.ingest.chunkers import html_scan

# Level (1 is highest) and text of a heading; a None text is the title's heading, left out of paths.
# Long loops check the document's deadline once per this many steps (+1; a power of two minus one).
_CHECK_EVERY = 0xFFF
Heading = tuple[int, str | None]

_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*))?$")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)$")
_FENCE_MARKERS = ("`", "~")  # the first character (after up to 3 spaces) of a line that may open a fence
_REMEMBERED_FENCE_CHARS = 80
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


# Not frozen (never mutated): one is built per block, and a frozen dataclass sets each field through
# object.__setattr__; 1 MB of one-line Markdown fences chunked ~16 % faster without it. So are the
# chunkers' other per-line and per-definition records.
@dataclass(slots=True)
class Block:
    """Whole non-blank lines ``text[start:end]`` (without the last ``"\\n"``) that belong together, and the
    headings they open, in order."""

    start: int
    end: int
    headings: tuple[Heading, ...] = ()


def line_spans(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of every line of ``text[start:end]``, without its ``"\\n"``. Checks the current
    deadline every few thousand lines (:func:`~shardfuse.pipeline.core.deadline.checkpoint`)."""
    lines = 0
    while start < end:
        lines += 1
        if not lines & _CHECK_EVERY:
            checkpoint("chunking")
        stop = text.find("\n", start, end)
        stop = end if stop == -1 else stop
        yield start, stop
        start = stop + 1


def _lines(text: str, start: int) -> Iterator[tuple[int, int, str]]:
    """``(start, end, line)`` of every line of ``text[start:]``, as :func:`line_spans` gives them, from one
    ``str.split`` (a slice and a ``find`` per line cost Markdown's parser a quarter of its time)."""
    for n, line in enumerate(text[start:].split("\n")):
        if not n & _CHECK_EVERY:
            checkpoint("chunking")
        end = start + len(line)
        if start < len(text):
            yield start, end, line
        start = end + 1


def _blank(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is empty or whitespace."""
    return start == end or text[start:end].isspace()


def units_of(text: str, start: int, end: int, *, paragraphs: bool) -> list[tuple[int, int]]:
    """The paragraphs (runs of non-blank lines) of ``text[start:end]``, or else its non-blank lines."""
    units: list[tuple[int, int]] = []
    after_blank = True
    for s, e in line_spans(text, start, end):
        if _blank(text, s, e):
            after_blank = True
        elif paragraphs and not after_blank:
            units[-1] = (units[-1][0], e)
        else:
            units.append((s, e))
            after_blank = False
    return units


# A plain-text title: the first paragraph when it is one line of at most this many characters and more follows.
TEXT_TITLE_MAX_CHARS = 200


def _parse_text(text: str) -> list[Block]:
    """Plain text: paragraphs. The first paragraph is the document's title (a level-1 heading) when it is a
    single short line with more text after it, as in a note, an e-mail subject or an abstract's title line."""
    blocks = [Block(s, e) for s, e in units_of(text, 0, len(text), paragraphs=True)]
    if len(blocks) > 1:
        first = text[blocks[0].start : blocks[0].end]
        if "\n" not in first and len(first.strip()) <= TEXT_TITLE_MAX_CHARS:
            blocks[0] = Block(blocks[0].start, blocks[0].end, headings=((1, " ".join(first.split())),))
    return blocks


def _parse_markdown(text: str) -> list[Block]:
    """Markdown: ATX and setext headings, fenced code blocks (kept whole, headings inside ignored), paragraphs,
    and a leading YAML/TOML front matter as one block."""
    front = _FRONT_MATTER.match(text)
    blocks = [Block(0, front.end())] if front else []
    para: tuple[int, int, bool] | None = None  # open paragraph: start, end, whether an underline may follow
    fence: tuple[re.Pattern[str], int] | None = None  # open fence: its closing line, its start
    for start, end, raw in _lines(text, front.end() if front else 0):
        line = raw.rstrip()
        if fence is not None:
            if fence[0].match(line):
                blocks.append(Block(fence[1], end))
                fence = None
            continue
        underline = _SETEXT.match(line) if para and para[2] else None
        if underline and para:
            level = 1 if underline.group(1)[0] == "=" else 2
            blocks.append(Block(para[0], end, ((level, " ".join(text[para[0] : para[1]].split())),)))
            para = None
            continue
        # A pattern is tried only on a line whose first character after up to 3 spaces can open it: most lines
        # of prose and of lists open neither, and a fence is no heading.
        marker = line[:4].lstrip(" ")[:1] if line[:1] == " " else line[:1]
        atx = _atx_heading(line) if marker == "#" else None
        closing = _closing_fence(line) if marker in _FENCE_MARKERS else None
        if para and (not line or atx or closing):
            blocks.append(Block(para[0], para[1]))
            para = None
        if atx:
            blocks.append(Block(start, end, (atx,)))
        elif closing:
            fence = (closing, start)
        elif line:
            para = (para[0], end, para[2]) if para else (start, end, not _NOT_SETEXT.match(line))
    blocks.extend(_paragraph(para))
    if fence:  # unclosed: it runs to the end
        blocks.append(Block(fence[1], len(text)))
    return blocks


def _paragraph(para: tuple[int, int, bool] | None) -> list[Block]:
    """The open paragraph ``(start, end, _)`` as a block, if there is one."""
    return [Block(para[0], para[1])] if para else []


def _atx_heading(line: str) -> Heading | None:
    """The level and text of ``line`` if it is an ATX heading (``## Text ##``), else None."""
    atx = _ATX.match(line)
    if atx is None:
        return None
    return len(atx.group(1)), _without_closing_sequence((atx.group(2) or "").strip()).strip()


def _without_closing_sequence(heading: str) -> str:
    """``heading`` without its closing ``#`` run (the whole text, or a run after spaces or tabs), as
    ``re.sub(r"(?:^|[ \t]+)#+$", "", heading)`` would; linear, where that regex is quadratic in a long run
    of spaces."""
    bare = heading.rstrip("#")
    if bare == heading:
        return heading
    if not bare:
        return ""
    return bare.rstrip(" \t") if bare[-1] in " \t" else heading


def _closing_fence(line: str) -> re.Pattern[str] | None:
    """If ``line`` opens a fenced code block, the pattern of the line that closes it (the same character, at
    least as many times); else None. A backtick fence's info string may hold no backtick."""
    # Fence lines repeat (```, ```python): a short one's answer is remembered. A long one is not, so that the
    # cache never keeps a document's huge lines alive.
    return _short_closing_fence(line) if len(line) <= _REMEMBERED_FENCE_CHARS else _opened_fence(line)


def _opened_fence(line: str) -> re.Pattern[str] | None:
    opening = _FENCE.match(line)
    if opening is None or (opening.group(1)[0] == "`" and "`" in opening.group(2)):
        return None
    marker = opening.group(1)
    return _fence_closer(marker[0], len(marker))


_short_closing_fence = functools.lru_cache(maxsize=1024)(_opened_fence)


@functools.lru_cache(maxsize=256)
def _fence_closer(char: str, length: int) -> re.Pattern[str]:
    """The line that closes a fence of ``length`` ``char``s (built once per kind: a file of fences is common)."""
    return re.compile(rf" {{0,3}}{re.escape(char)}{{{length},}}[ \t]*$")


def _parse_rst(text: str) -> list[Block]:
    """reStructuredText: section titles (levels in order of first appearance of each adornment style, as
    docutils assigns them) and paragraphs."""
    lines = list(line_spans(text, 0, len(text)))
    rows = [text[s:e].rstrip() for s, e in lines]
    styles: list[tuple[str, bool]] = []
    blocks: list[Block] = []
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
            blocks.append(Block(start, lines[i + used - 1][1], ((styles.index(style) + 1, heading),)))
            i += used
            continue
        if blank and para:
            blocks.append(Block(*para))
        para = None if blank else (para[0] if para else start, end)
        i += 1
    blocks.extend([Block(*para)] if para else [])
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


def _parse_html(text: str) -> list[Block]:
    """HTML: blocks start at blank lines and at lines that open a block-level tag; ``<pre>``, ``<script>``,
    ``<style>``, ``<textarea>`` and comments are kept whole. Headings are ``<h1>``..``<h6>``."""
    raw = html_scan.raw_ranges(text)  # never cut inside these; headings inside them do not count
    raw_starts = [s for s, _ in raw]
    opens = {m.start() for m in _HTML_BLOCK_LINE.finditer(text)}
    spans: list[tuple[int, int]] = []
    for start, end in line_spans(text, 0, len(text)):
        if spans and _inside(raw, raw_starts, start):
            spans[-1] = (spans[-1][0], end)
        elif _blank(text, start, end):
            continue
        elif spans and start not in opens and spans[-1][1] == start - 1:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    headings: dict[int, list[Heading]] = {}
    starts = [s for s, _ in spans]
    for at, level, inner in html_scan.headings(text):
        if not _inside(raw, raw_starts, at):
            headings.setdefault(bisect_right(starts, at) - 1, []).append((level, html_text(inner)))
    return [Block(s, e, tuple(headings.get(i, ()))) for i, (s, e) in enumerate(spans)]


def _inside(raw: list[tuple[int, int]], raw_starts: list[int], pos: int) -> bool:
    """Whether ``pos`` lies after the start of one of the ``raw`` ranges and before its end."""
    i = bisect_right(raw_starts, pos) - 1
    return i >= 0 and raw[i][0] < pos < raw[i][1]


def html_title(text: str) -> str | None:
    """The text of an HTML document's ``<title>``, if it has one."""
    inner = html_scan.title(text)
    return None if inner is None else html_text(inner)


def html_text(fragment: str) -> str:
    """The text of an HTML fragment: tags dropped, entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(html_scan.strip_tags(fragment)).split())


PARSERS: dict[str, Callable[[str], list[Block]]] = {
    "markdown": _parse_markdown,
    "rst": _parse_rst,
    "html": _parse_html,
    "text": _parse_text,
}
