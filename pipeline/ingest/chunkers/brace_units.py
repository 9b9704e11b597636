"""Brace languages' units, from the header patterns and brace matching of
:mod:`shardfuse.pipeline.ingest.symbols`: see :mod:`.code_units`."""

from __future__ import annotations

import functools
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate, compress

from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.ingest.chunkers.code_layout import Layout, SourceLines, Unit, fill
from shardfuse.pipeline.ingest.symbols import EXTRACTORS
from shardfuse.pipeline.ingest.symbols.braces import (
    NOT_BEFORE_NAME,
    NOT_NAMES,
    BraceLanguage,
    BraceTokens,
    Header,
    blank_literal,
)
from shardfuse.pipeline.ingest.symbols.header_tails import TailScan
from shardfuse.pipeline.ingest.symbols.model import Kind

# The brace languages are whatever shardfuse.pipeline.ingest.symbols reads with brace patterns.
BRACE_LANGUAGES: dict[str, BraceLanguage] = {
    str(name): extractor for name, extractor in EXTRACTORS.items() if isinstance(extractor, BraceLanguage)
}
# The text before a "{" that opens a block whose contents are top level: namespaces, Rust modules,
# TypeScript modules and `declare global`, C++ `extern "C"` (its string blanked).
_CONTAINER = re.compile(
    r"(?:\s*#!?\[[^\]]*\])*"  # Rust attributes: #[cfg(test)]
    r"\s*(?:(?:export|declare|inline|pub(?:\([^)]*\))?)\s+)*(?:namespace|module|mod)\b[^;{}()=]*"
    r"|\s*(?:declare\s+)?global\s*|\s*extern\s*"
)
# A line (strings blanked) holding only an attribute or annotation: #[derive(..)], @Override, [Test].
_ATTRIBUTE = re.compile(r"#!?\[.*\]|@[A-Za-z_][\w.]*(?:\(.*\))?|\[[A-Za-z_][\w.]*(?:\(.*\))?\]")
# Code beyond comments, whitespace and lone braces (the closing brace of a namespace is not code).
_CODE_CHAR = re.compile(r"[^\s{};]")
_STATEMENT_EDGES = frozenset("{};")  # the tokens that end a statement, and the braces among them
# Definitions nested deeper than this are not split at their members: a definition that deep is split at
# lines like any other. Real code nests a few levels; a file of ten thousand nested functions would
# otherwise recurse past Python's limit, and rescan its members once per level.
MAX_PART_DEPTH = 8


def brace_layout(text: str, language: str) -> Layout:
    """The units of ``text`` in ``language``, one of :data:`BRACE_LANGUAGES`."""
    return _BraceScan(text, BRACE_LANGUAGES[language]).layout()


# Not frozen, for speed (never mutated): see markup_blocks.Block.
@dataclass(slots=True)
class _Header:
    """A definition header found in the blanked code (``code`` offsets are text offsets + 1)."""

    start: int  # text offset of the header's first line (the code offset of the line end before it)
    name_at: int  # text offset of the name
    name_end: int  # code offset of the name's end
    name: str
    header: Header
    brace: int  # braces open at the name
    paren: int  # parentheses and brackets open at the name
    level: int  # braces open at the name, not counting those of namespaces and modules


class _BraceScan:
    """One document of a brace language, blanked and scanned once."""

    def __init__(self, text: str, language: BraceLanguage) -> None:
        self.text = text
        self.lines = SourceLines(text)
        # One line end before the text, as shardfuse.pipeline.ingest.symbols expects: header patterns start with one.
        self.code = "\n" + language.literals.sub(blank_literal, text)
        self.uncommented = language.literals.sub(_blank_comment, text)  # strings kept: they are code
        every = self._headers(language.headers)
        self.header_starts = [h.start for h in every]  # where a bodiless definition stops (see BraceTokens.end_of)
        self.definitions = sorted((h for h in every if h.header.kind is not Kind.CONSTANT), key=lambda h: h.name_at)
        self.name_offsets = [h.name_at for h in self.definitions]

    def layout(self) -> Layout:
        top = [h for h in self.definitions if h.level == 0 and h.paren == 0]
        units = self._units(top, 0, len(self.text), floor=1, depth=0)
        named = [u for u in units if u.name]
        starts, ends = [u.start for u in named], [u.end for u in named]
        definitions = tuple((h.name_at, h.name) for h in self.definitions if _within(starts, ends, h.name_at))
        return Layout(tuple(units), definitions)

    def _units(self, headers: list[_Header], lo: int, hi: int, *, floor: int, depth: int) -> list[Unit]:
        """Units of ``[lo, hi)`` with ``headers`` (one nesting level, by name offset) as definitions; parts
        only down to :data:`MAX_PART_DEPTH` levels."""
        definitions: list[Unit] = []
        cursor = lo
        for h in sorted(headers, key=lambda h: h.start):
            header_line = self.lines.line_of(h.start)
            if h.start < cursor or header_line < floor:
                continue  # inside the previous definition, or on its parent's header line
            end = min(self._end(h), hi)
            first = self.lines.attach_above(header_line, max(floor, self.lines.line_of(cursor)), self._attachable)
            start = self.lines.start(first)
            parts: tuple[Unit, ...] = ()
            members = [
                m
                for m in self.definitions[
                    bisect_right(self.name_offsets, h.name_at) : bisect_left(self.name_offsets, end)
                ]
                if m.brace == h.brace + 1 and m.paren == h.paren
            ]
            if members and depth < MAX_PART_DEPTH:
                inner = self._units(members, start, end, floor=self.lines.line_of(h.name_at) + 1, depth=depth + 1)
                parts = tuple(inner) if any(u.name for u in inner) else ()
            definitions.append(Unit(start, end, h.name, parts=parts))
            cursor = end
        return fill(self.text, lo, hi, definitions, self._is_code)

    def _end(self, h: _Header) -> int:
        """The end of the line where ``h``'s definition ends (its closing brace, ``;`` or statement end)."""
        following = bisect_left(self.header_starts, h.name_end)
        stop = self.header_starts[following] if following < len(self.header_starts) else len(self.code)
        end = self.tokens.end_of(self.code, h.name_end, statement=h.header.statement, stop=stop)
        if end is None:  # still open at the end of the document
            return len(self.text)
        return self.lines.end(self.lines.line_of(max(end - 2, h.start)))  # end - 2: its last character, in text

    def _headers(self, headers: tuple[Header, ...]) -> list[_Header]:
        """Every header, filtered as shardfuse.pipeline.ingest.symbols filters them, by position."""
        found: dict[int, _Header] = {}
        tails = TailScan(self.code)
        for header in headers:
            for k, m in enumerate(header.finditer(self.code, tails=tails)):
                if not k & 0xFFF:
                    checkpoint("chunking")
                name, at = m["name"], m.start("name")
                if name in NOT_NAMES or at - 1 in found:
                    continue
                if not NOT_BEFORE_NAME.isdisjoint(self.code[m.start() : at].split()):
                    continue
                i = bisect_left(self.tokens.pos, at)
                braces, parens, levels = self.depths
                found[at - 1] = _Header(m.start(), at - 1, m.end("name"), name, header, braces[i], parens[i], levels[i])
        return sorted(found.values(), key=lambda h: (h.start, h.name_at))

    # The tokens and depths are read only where a definition was found: a file of declarations (a C header
    # of prototypes) has none, and skips them.
    @functools.cached_property
    def tokens(self) -> BraceTokens:
        return BraceTokens.scan(self.code)

    @functools.cached_property
    def depths(self) -> tuple[list[int], list[int], list[int]]:
        """Braces, parentheses and non-namespace braces open before each token, and after the last one."""
        tokens = self.tokens
        steps = [0] * len(tokens.tok)  # how each token moves the level: only braces do, and not a namespace's
        containers: list[bool] = []  # per open brace: does it open a namespace or module?
        boundary = 0  # where the statement holding the current token began
        # Only "{", "}" and ";" are walked in Python; the level is a running sum of the steps (in C).
        for i in compress(range(len(tokens.tok)), map(_STATEMENT_EDGES.__contains__, tokens.tok)):
            token, at = tokens.tok[i], tokens.pos[i]
            if token == "{":
                containers.append(_CONTAINER.fullmatch(self.code, boundary, at) is not None)
                steps[i] = 0 if containers[-1] else 1
            elif token == "}" and containers and not containers.pop():
                steps[i] = -1
            boundary = at + 1
        return tokens.brace, tokens.paren, list(accumulate(steps, initial=0))

    def _attachable(self, line: int) -> bool:
        """A comment, doc-comment, attribute or annotation line (attached to the definition below it)."""
        start, end = self.lines.start(line), self.lines.end(line)
        if not self.text[start:end].strip():
            return False
        return (
            not self.uncommented[start:end].strip()
            or _ATTRIBUTE.fullmatch(self.code[start + 1 : end + 1].strip()) is not None
        )

    def _is_code(self, start: int, end: int) -> bool:
        return _CODE_CHAR.search(self.uncommented, start, end) is not None


def _within(starts: list[int], ends: list[int], offset: int) -> bool:
    """Whether ``offset`` falls in one of the ranges ``[starts[i], ends[i])`` (in order, not overlapping)."""
    i = bisect_right(starts, offset) - 1
    return i >= 0 and offset < ends[i]


def _blank_comment(match: re.Match[str]) -> str:
    s = match.group()
    return blank_literal(match) if s.startswith(("//", "/*")) else s
