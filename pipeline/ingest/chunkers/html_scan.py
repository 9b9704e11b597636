"""The elements of HTML that semantic chunking reads (raw-text elements, headings, the title), found in one
pass over the text.

Each function returns what a regular expression of the form ``<tag\\b[^>]*>(.{0,N}?)</tag\\s*>`` would
find with ``finditer`` (re.I | re.S): the same matches, in the same order. Written out because that
expression costs O(n²) on hostile text: every ``<h2 `` (or ``<pre ``) without a ``>`` after it scans to
the end of the text, and every unclosed ``<h2>`` scans its N characters. Here the next ``>`` is found
once for all the tags before it (:class:`_NextGt`), and closing tags are looked up among the positions of
all closing tags, found in one pass.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator

# What opens a raw-text element (kept whole by the chunker) or a comment.
_RAW_OPEN = re.compile(r"<!--|<(pre|script|style|textarea)\b", re.I)
_RAW_CLOSE = {tag: re.compile(rf"</{tag}\s*>", re.I) for tag in ("pre", "script", "style", "textarea")}
_HEADING_OPEN = re.compile(r"<h([1-6])\b", re.I)
_HEADING_CLOSE = re.compile(r"</h([1-6])\s*>", re.I)
_TITLE_OPEN = re.compile(r"<title\b", re.I)
_TITLE_CLOSE = re.compile(r"</title\s*>", re.I)
# The longest heading or title text read (more is not a heading a reader would recognise).
TEXT_LIMIT = 4000


class _NextGt:
    """The first ``>`` at or after a position, for positions asked in increasing order: amortised O(1)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._found = -2  # the answer for the last position asked (-1: none); -2: nothing asked yet

    def at_or_after(self, pos: int) -> int:
        if self._found == -1 or self._found >= pos:
            return self._found
        self._found = self._text.find(">", pos)
        return self._found


def raw_ranges(text: str) -> list[tuple[int, int]]:
    """Comments (``<!-- … -->``) and ``<pre>``, ``<script>``, ``<style>``, ``<textarea>`` elements, each up to
    its closing tag; unclosed, to the end of the text."""
    ranges: list[tuple[int, int]] = []
    gt = _NextGt(text)
    resume = 0
    for m in _RAW_OPEN.finditer(text):
        if m.start() < resume:
            continue
        if m.group(1) is None:  # a comment
            close = text.find("-->", m.end())
            end = len(text) if close == -1 else close + 3
        else:
            tag_end = gt.at_or_after(m.end())
            if tag_end == -1:
                continue  # no ">" after it: not an element (a comment may still follow)
            closing = _RAW_CLOSE[m.group(1).lower()].search(text, tag_end + 1)
            end = len(text) if closing is None else closing.end()
        ranges.append((m.start(), end))
        resume = end
    return ranges


def headings(text: str) -> Iterator[tuple[int, int, str]]:
    """``(start, level, inner HTML)`` of every ``<h1>`` .. ``<h6>`` closed by the same level within
    :data:`TEXT_LIMIT` characters."""
    closes: dict[str, list[tuple[int, int]]] = {}
    for m in _HEADING_CLOSE.finditer(text):
        closes.setdefault(m.group(1), []).append(m.span())
    if not closes:
        return
    starts = {level: [s for s, _ in spans] for level, spans in closes.items()}
    gt = _NextGt(text)
    resume = 0
    for m in _HEADING_OPEN.finditer(text):
        if m.start() < resume:
            continue
        level = m.group(1)
        found = _closed(text, m.end(), gt, starts.get(level, []))
        if found is None:
            if gt.at_or_after(m.end()) == -1:
                return  # no ">" left: no later tag can open a heading
            continue
        inner_start, close_at = found
        yield m.start(), int(level), text[inner_start:close_at]
        resume = closes[level][bisect_left(starts[level], close_at)][1]


def title(text: str) -> str | None:
    """The inner HTML of the first ``<title>`` closed within :data:`TEXT_LIMIT` characters."""
    close_starts = [m.start() for m in _TITLE_CLOSE.finditer(text)]
    if not close_starts:
        return None
    gt = _NextGt(text)
    for m in _TITLE_OPEN.finditer(text):
        found = _closed(text, m.end(), gt, close_starts)
        if found is not None:
            return text[found[0] : found[1]]
    return None


def _closed(text: str, after_name: int, gt: _NextGt, close_starts: list[int]) -> tuple[int, int] | None:
    """For an opening tag whose name ends at ``after_name``: where its inner text starts and where the first
    closing tag (of ``close_starts``) at most :data:`TEXT_LIMIT` characters later begins; None if the tag has
    no ``>`` or no such closing tag."""
    tag_end = gt.at_or_after(after_name)
    if tag_end == -1:
        return None
    inner = tag_end + 1
    i = bisect_left(close_starts, inner)
    if i == len(close_starts) or close_starts[i] - inner > TEXT_LIMIT:
        return None
    return inner, close_starts[i]


def strip_tags(fragment: str) -> str:
    """``fragment`` without its tags: what ``re.sub(r"<[^>]*>", "", fragment)`` gives, in linear time."""
    out: list[str] = []
    pos = 0
    while (lt := fragment.find("<", pos)) != -1:
        gt = fragment.find(">", lt + 1)
        if gt == -1:
            break  # no tag can close after this point
        out.append(fragment[pos:lt])
        pos = gt + 1
    out.append(fragment[pos:])
    return "".join(out)
