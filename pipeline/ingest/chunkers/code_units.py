"""Where source code's top-level definitions are: the units the code chunker packs into spans.

:func:`layout` cuts a document into :class:`Unit` s that cover it in order, line-aligned: each definition
(with the comment, doc-comment, decorator, attribute and annotation lines directly above it) is one unit,
and the code between definitions is grouped into filler units. A definition whose body holds definitions
of its own (a class's methods, an ``impl`` block's functions) carries ``parts``: its range cut the same
way one level down, so that a definition too large for one chunk can be split at its members.

- **Python** is parsed with :mod:`ast`: definitions are ``def``/``async def``/``class``; constants, type
  aliases and definitions inside top-level statements (``if TYPE_CHECKING:``) are filler. A file that does
  not parse gets one filler unit and ``parsed=False``.
- **Brace languages** reuse :mod:`shardfuse.pipeline.ingest.symbols` (strings and comments blanked, header patterns,
brace
  matching): definitions are function and type headers (not constants) at brace depth 0, where the braces
  of ``namespace``/``mod``/``module``/``extern "C"`` blocks do not count; a definition ends where
  :mod:`shardfuse.pipeline.ingest.symbols` ends it (its closing brace, or the ``;`` or line end of a statement).

``definitions`` lists ``(offset, name)`` of every definition inside a definition unit, nested ones
included, in order: filler defines nothing.
"""

from __future__ import annotations

import ast
import re
import warnings
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from shardfuse.pipeline.ingest.symbols import EXTRACTORS, Language
from shardfuse.pipeline.ingest.symbols.braces import (
    NOT_BEFORE_NAME,
    NOT_NAMES,
    BraceLanguage,
    BraceTokens,
    Header,
    blank_literal,
)
from shardfuse.pipeline.ingest.symbols.model import Kind

# The brace languages are whatever shardfuse.pipeline.ingest.symbols reads with brace patterns.
BRACE_LANGUAGES: dict[str, BraceLanguage] = {
    str(name): extractor for name, extractor in EXTRACTORS.items() if isinstance(extractor, BraceLanguage)
}
LANGUAGES: frozenset[str] = frozenset({Language.PYTHON, *BRACE_LANGUAGES})

_PY_DEFINITION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# Python reads a lone "\r" as a line end; ast line numbers would not match lines counted by "\n".
_LONE_CR = re.compile(r"\r(?!\n)")
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


@dataclass(frozen=True, slots=True)
class Unit:
    """A line-aligned range of the text: one definition (``name``) or code between definitions.

    ``code`` is False for a filler holding only comments and blank lines. ``parts`` cuts a definition at
    the definitions directly inside it (same rules), covering ``[start, end)`` in order; empty when it has
    none.
    """

    start: int
    end: int
    name: str | None = None
    code: bool = True
    parts: tuple[Unit, ...] = ()


@dataclass(frozen=True, slots=True)
class Layout:
    """A document's units (covering it in order) and every definition inside them as ``(offset, name)``."""

    units: tuple[Unit, ...]
    definitions: tuple[tuple[int, str], ...]
    parsed: bool = True  # False: Python that does not parse, one filler unit


def require_language(language: str) -> None:
    """ValueError unless :func:`layout` reads ``language``."""
    if language not in LANGUAGES:
        raise ValueError(f"no code chunking for language {language!r}; known: {', '.join(sorted(LANGUAGES))}")


def layout(text: str, language: str) -> Layout:
    """The units of ``text`` (non-empty) in ``language``; ValueError for a language this module cannot read."""
    require_language(language)
    if language == Language.PYTHON:
        return _python_layout(text)
    return _BraceScan(text, BRACE_LANGUAGES[language]).layout()


class _Lines:
    """Line starts of a text, by ``"\\n"`` only; lines are numbered from 1 as in :mod:`ast`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0, *(m.end() for m in re.finditer("\n", text))]
        if self.starts[-1] == len(text) and len(self.starts) > 1:
            self.starts.pop()  # no line after a final "\n"

    def start(self, line: int) -> int:
        return self.starts[line - 1]

    def end(self, line: int) -> int:
        """The offset after line ``line``'s "\\n" (or the end of the text)."""
        return self.starts[line] if line < len(self.starts) else len(self.text)

    def line_of(self, offset: int) -> int:
        return bisect_right(self.starts, offset)

    def content(self, line: int) -> str:
        return self.text[self.start(line) : self.end(line)]

    def attach_above(self, line: int, floor: int, attachable: Callable[[int], bool]) -> int:
        """The first line of the run of attachable lines directly above ``line``, not above ``floor``."""
        while line > floor and attachable(line - 1):
            line -= 1
        return line


def fill(text: str, lo: int, hi: int, definitions: Sequence[Unit], is_code: Callable[[int, int], bool]) -> list[Unit]:
    """``definitions`` (in order, inside ``[lo, hi)``) with filler units between them, covering ``[lo, hi)``.

    Whitespace-only filler joins the unit before it (the first unit when nothing precedes it), so that no
    unit is blank and a definition's trailing blank lines stay with it.
    """
    units: list[Unit] = []
    cursor = lo
    for unit in (*definitions, None):
        gap_end = hi if unit is None else unit.start
        if gap_end > cursor:
            units.append(Unit(cursor, gap_end, code=is_code(cursor, gap_end)))
            if text[cursor:gap_end].isspace():
                units.pop()
                if units:
                    units[-1] = _widen(units[-1], end=gap_end)
                elif unit is not None:
                    unit = _widen(unit, start=cursor)
        if unit is not None:
            units.append(unit)
            cursor = unit.end
    if not units:
        return [Unit(lo, hi, code=False)]
    return units


def _widen(unit: Unit, *, start: int | None = None, end: int | None = None) -> Unit:
    parts = list(unit.parts)
    if parts and start is not None:
        parts[0] = _widen(parts[0], start=start)
    if parts and end is not None:
        parts[-1] = _widen(parts[-1], end=end)
    return replace(unit, start=unit.start if start is None else start, end=unit.end if end is None else end,
                   parts=tuple(parts))  # fmt: skip


# -- Python ----------------------------------------------------------------------------------------------


def _python_layout(text: str) -> Layout:
    try:
        with warnings.catch_warnings():  # invalid escapes and the like: the document's problem, not ours to log
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = None if _LONE_CR.search(text) else ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    if tree is None:
        return Layout((Unit(0, len(text)),), (), parsed=False)
    lines = _Lines(text)
    units = _python_units(tree.body, lines, 0, len(text), 1)
    definitions = sorted(
        found for stmt in tree.body if isinstance(stmt, _PY_DEFINITION) for found in _python_names(stmt, lines)
    )
    return Layout(tuple(units), tuple(definitions))


def _python_units(body: list[ast.stmt], lines: _Lines, lo: int, hi: int, floor: int) -> list[Unit]:
    """Units of the statements ``body`` spanning ``[lo, hi)``; ``floor`` is the first line a definition's
    comments may start on."""
    definitions: list[Unit] = []
    for stmt in body:
        if isinstance(stmt, _PY_DEFINITION):
            first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
            first = lines.attach_above(first, floor, lambda n: lines.content(n).lstrip().startswith("#"))
            start, end = lines.start(first), min(lines.end(stmt.end_lineno or stmt.lineno), hi)
            if start >= lo and (not definitions or start >= definitions[-1].end):
                members = _python_units(stmt.body, lines, start, end, stmt.lineno + 1)
                parts = tuple(members) if any(u.name for u in members) else ()
                definitions.append(Unit(start, end, stmt.name, parts=parts))
        floor = (stmt.end_lineno or stmt.lineno) + 1
    if not definitions:
        return [Unit(lo, hi)]
    return fill(lines.text, lo, hi, definitions, lambda a, b: _python_is_code(lines.text[a:b]))


def _python_names(node: ast.stmt, lines: _Lines) -> Iterator[tuple[int, str]]:
    """Offsets (of their ``def``/``class`` lines) and names of ``node`` and of every definition inside it,
    at any depth of statements (a ``def`` inside an ``if`` counts; a lambda is not a definition)."""
    stack: list[ast.AST] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, _PY_DEFINITION):
            yield lines.start(current.lineno), current.name
        stack.extend(
            c for c in ast.iter_child_nodes(current) if isinstance(c, ast.stmt | ast.excepthandler | ast.match_case)
        )


def _python_is_code(segment: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in segment.split("\n"))


# -- brace languages -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
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
        self.lines = _Lines(text)
        # One line end before the text, as shardfuse.pipeline.ingest.symbols expects: header patterns start with one.
        self.code = "\n" + language.literals.sub(blank_literal, text)
        self.uncommented = language.literals.sub(_blank_comment, text)  # strings kept: they are code
        self.tokens = BraceTokens.scan(self.code)
        self.braces, self.parens, self.levels = self._depths()
        every = self._headers(language.headers)
        self.header_starts = [h.start for h in every]  # where a bodiless definition stops (see BraceTokens.end_of)
        self.definitions = sorted((h for h in every if h.header.kind is not Kind.CONSTANT), key=lambda h: h.name_at)
        self.name_offsets = [h.name_at for h in self.definitions]

    def layout(self) -> Layout:
        top = [h for h in self.definitions if h.level == 0 and h.paren == 0]
        units = self._units(top, 0, len(self.text), floor=1)
        inside = [(u.start, u.end) for u in units if u.name]
        definitions = tuple((h.name_at, h.name) for h in self.definitions if _within(inside, h.name_at))
        return Layout(tuple(units), definitions)

    def _units(self, headers: list[_Header], lo: int, hi: int, *, floor: int) -> list[Unit]:
        """Units of ``[lo, hi)`` with ``headers`` (one nesting level, by name offset) as definitions."""
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
            if members:
                inner = self._units(members, start, end, floor=self.lines.line_of(h.name_at) + 1)
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
        for header in headers:
            for m in header.pattern.finditer(self.code):
                name, at = m["name"], m.start("name")
                if name in NOT_NAMES or at - 1 in found:
                    continue
                if not NOT_BEFORE_NAME.isdisjoint(self.code[m.start() : at].split()):
                    continue
                i = bisect_left(self.tokens.pos, at)
                found[at - 1] = _Header(
                    m.start(), at - 1, m.end("name"), name, header, self.braces[i], self.parens[i], self.levels[i]
                )
        return sorted(found.values(), key=lambda h: (h.start, h.name_at))

    def _depths(self) -> tuple[list[int], list[int], list[int]]:
        """Braces, parentheses and non-namespace braces open before each token, and after the last one."""
        braces, parens, levels = list(self.tokens.brace), list(self.tokens.paren), []
        containers: list[bool] = []  # per open brace: does it open a namespace or module?
        level = brace = paren = 0
        boundary = 0  # where the statement holding the current token began
        for at, token in zip(self.tokens.pos, self.tokens.tok, strict=True):
            levels.append(level)
            if token == "{":
                containers.append(_CONTAINER.fullmatch(self.code, boundary, at) is not None)
                level += not containers[-1]
                brace += 1
            elif token == "}":
                if containers and not containers.pop():
                    level -= 1
                brace -= 1
            elif token in ("(", "["):
                paren += 1
            elif token in (")", "]"):
                paren -= 1
            if token in ("{", "}", ";"):
                boundary = at + 1
        return [*braces, brace], [*parens, paren], [*levels, level]

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


def _within(ranges: list[tuple[int, int]], offset: int) -> bool:
    """Whether ``offset`` falls in one of ``ranges`` (in order, not overlapping)."""
    i = bisect_right(ranges, offset, key=lambda r: r[0]) - 1
    return i >= 0 and offset < ranges[i][1]


def _blank_comment(match: re.Match[str]) -> str:
    s = match.group()
    return blank_literal(match) if s.startswith(("//", "/*")) else s
