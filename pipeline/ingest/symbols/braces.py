"""Brace languages: strings and comments blanked, then header patterns, brace balance and statement ends."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, compress, repeat

from shardfuse.pipeline.ingest.symbols.header_tails import Tail, TailScan
from shardfuse.pipeline.ingest.symbols.model import NO_SYMBOLS, ChunkSymbols, Definition, Kind, Role, summarise


@dataclass(frozen=True, slots=True)
class Header:
    pattern: re.Pattern[str]
    kind: Kind
    statement: bool  # ends at `;` or a line end (constants, aliases, arrow functions), not a closing brace
    tail: Tail | None = None  # what must follow ``pattern``'s match (:mod:`.header_tails`)

    def finditer(self, code: str, pos: int = 0, *, tails: TailScan | None = None) -> Iterator[re.Match[str]]:
        """The matches of the header in ``code`` from ``pos``, as ``finditer`` of the whole pattern (its
        tail included) would find them; each match object is ``pattern``'s (its groups are the same)."""
        if self.tail is None:
            yield from self.pattern.finditer(code, pos)
            return
        scan = tails or TailScan(code)
        end_of_tail = scan.ender(self.tail)
        search = self.pattern.search
        while (m := search(code, pos)) is not None:
            end = end_of_tail(m.end())
            if end is None:
                if scan.none_after(self.tail, m.start() + 1):  # a file of declarations without bodies
                    return
                pos = m.start() + 1
                continue
            yield m
            pos = max(end, m.start() + 1)


_TOKEN = re.compile(r"=>|[=!<>]=|[{}()\[\];=\n]")
_TOKEN_SPLIT = re.compile(f"({_TOKEN.pattern})")  # split keeps the tokens: text, token, text, ..., text
# A line end continues a statement when the line ends in one of these, or the next line starts with one.
_CONTINUES_BEFORE = frozenset("=,([{+-*/%&|^?:<>!.")
_CONTINUES_AFTER = frozenset(".?:|&+=")
# Keywords that look like a name before `(`: `if (x) {`, `catch (e) {`, `else if (...)`.
NOT_NAMES = frozenset({
    "if", "for", "while", "switch", "catch", "return", "sizeof", "else", "do", "new", "delete", "throw",
    "function", "typeof", "await", "yield", "super", "this", "with", "case", "using", "lock", "fixed",
    "foreach", "synchronized", "assert", "try", "finally", "instanceof", "alignof", "decltype",
    "static_assert", "defined", "when", "match", "elif",
})  # fmt: skip
# Words that make `word name(...)` a statement rather than a header: `return f(x);`, `new Foo(x) {`.
NOT_BEFORE_NAME = frozenset({
    "return", "new", "else", "throw", "await", "yield", "case", "goto", "typeof", "delete", "assert", "using",
    "import",
})  # fmt: skip
_BRACE = re.compile(r"[{}]")
_PAREN_STEP = {"(": 1, "[": 1, ")": -1, "]": -1}
_BRACE_STEP = {"{": 1, "}": -1}
_NEWLINE = re.compile(r"\n")
_CLOSING_COMMENT = re.compile(r"\*/[ \t\r]*(?:\n|\Z)")


@dataclass(frozen=True, slots=True)
class BraceTokens:
    """Brackets, semicolons, ``=`` and line ends of blanked text, with the depths before each."""

    pos: list[int]
    tok: list[str]
    paren: list[int]  # parentheses and brackets open before each token, and after the last (one entry more)
    brace: list[int]  # braces open before each token, and after the last (one entry more)
    match: list[int]  # for a "{": the index of its "}", or -1 when it closes after the chunk
    closes_outer: bool  # a "}" closes a brace opened before the chunk

    @classmethod
    def scan(cls, code: str) -> BraceTokens:
        # Hostile files hold hundreds of thousands of tokens, so no Python step a token: the text split at its
        # tokens gives them and, by the running sum of the pieces' lengths, their offsets; the depths are
        # running sums of each token's step; only the braces are walked, to pair them. (A list of match objects
        # instead would be as many objects for the garbage collector to traverse, again and again.)
        pieces = _TOKEN_SPLIT.split(code)
        tok = pieces[1::2]
        pos = list(accumulate(map(len, pieces), initial=0))[1:-1:2]
        paren = list(accumulate(map(_PAREN_STEP.get, tok, repeat(0)), initial=0))
        brace = list(accumulate(map(_BRACE_STEP.get, tok, repeat(0)), initial=0))
        match = [-1] * len(tok)
        opened: list[int] = []
        closes_outer = False
        for i in compress(range(len(tok)), map(_BRACE_STEP.__contains__, tok)):
            if tok[i] == "{":
                opened.append(i)
            elif opened:
                match[opened.pop()] = i
            else:
                closes_outer = True
        return cls(pos, tok, paren, brace, match, closes_outer)

    def end_of(self, code: str, after: int, *, statement: bool, stop: int) -> int | None:
        """Where the definition whose name ends at ``after`` ends, or None when past the chunk's end.

        ``stop`` is where the next header starts: a definition whose body has not opened by then has none.
        """
        i = bisect_left(self.pos, after)
        if i == len(self.tok):
            return None
        p0, b0 = self.paren[i], self.brace[i]
        while i < len(self.tok):
            t, at = self.tok[i], self.pos[i]
            if not statement and at >= stop:
                return stop
            if self.paren[i] == p0 and self.brace[i] == b0:
                if t == "{":
                    j = self.match[i]
                    if j < 0 or not statement:  # closes past the chunk, or the body ends the definition
                        return None if j < 0 else self.pos[j] + 1
                    i = j  # braces inside a statement (`int x[] = {1, 2};`): go on after them
                elif t in (";", "}", ")", "]"):  # its own end, or the end of what encloses it
                    return at + (t == ";")
                elif t in ("=", "=>"):
                    statement = True  # `fun f() = x`, `int F() => x;`, `void f() = delete;`
                elif t == "\n" and statement and _statement_ends(code, at):
                    return at
            i += 1
        return None


def _statement_ends(code: str, newline: int) -> bool:
    k = newline - 1
    while k >= 0 and code[k] in " \t\r":
        k -= 1
    if k >= 0 and code[k] in _CONTINUES_BEFORE:
        return False
    k = newline + 1
    while k < len(code) and code[k] in " \t\r\n":
        k += 1
    return k == len(code) or code[k] not in _CONTINUES_AFTER


def blank_literal(match: re.Match[str]) -> str:
    """A string or comment as spaces, keeping its line ends so that offsets and lines do not move."""
    s = match.group()
    return " " * len(s) if "\n" not in s else "\n".join(" " * len(part) for part in s.split("\n"))


@dataclass(frozen=True, slots=True)
class BraceLanguage:
    literals: re.Pattern[str]  # strings and comments
    headers: tuple[Header, ...]

    def extract(self, text: str, *, starts_mid_line: bool, ends_document: bool) -> ChunkSymbols:
        # One line end before the text: headers are found by patterns starting with a line end (see `header`),
        # and every offset below is into `code`.
        code = "\n" + self.literals.sub(blank_literal, text)
        comment_end = _closing_comment_prefix(text)
        if comment_end:
            code = _blank_prefix(code, comment_end + 1)
        # A first line that is the tail of a line cannot start a header.
        first_line_end = code.find("\n", 1) if starts_mid_line else 0
        if first_line_end < 0:
            first_line_end = len(code)
        found: dict[int, tuple[int, int, str, Header]] = {}  # by name start: (start, name end, name, header)
        tails = TailScan(code)
        for header in self.headers:
            for m in header.finditer(code, first_line_end, tails=tails):
                name = m["name"]
                if name in NOT_NAMES or m.start("name") in found:
                    continue
                if not NOT_BEFORE_NAME.isdisjoint(code[m.start() : m.start("name")].split()):
                    continue
                found[m.start("name")] = (m.start(), m.end("name"), name, header)
        indented = _first_line_indented(code, first_line_end)
        if not found:  # the common case of a chunk inside a long body: no extents to find
            return ChunkSymbols(role=Role.BODY) if indented or _closes_outer_brace(code) else NO_SYMBOLS
        tokens = BraceTokens.scan(code)
        ordered = sorted(found.values())
        starts = [start for start, *_ in ordered]
        lines = _LineIndex(code)
        definitions: list[Definition] = []
        open_ends: list[int | None] = []  # ends of the definitions enclosing the current one
        for start, name_end, name, header in ordered:
            following = bisect_left(starts, name_end)
            stop = starts[following] if following < len(starts) else len(code)
            end = tokens.end_of(code, name_end, statement=header.statement, stop=stop)
            while open_ends and open_ends[-1] is not None and open_ends[-1] <= start:
                open_ends.pop()
            first = lines.of(start + 1)  # the match starts at the line end before its header
            last = lines.last_text if end is None else lines.of(end - 1)
            definitions.append(Definition(name, header.kind, nested=bool(open_ends), closed=end is not None,
                                          lines=(first, max(first, last))))
            open_ends.append(end)
        return summarise(
            definitions,
            continues=indented or tokens.closes_outer,
            ends_document=ends_document,
        )


class _LineIndex:
    """Line numbers in the chunk (0-based) of offsets into ``code``, the chunk after one line end."""

    def __init__(self, code: str) -> None:
        self._newlines = [m.start() for m in _NEWLINE.finditer(code)]
        # A definition open at the chunk's end ends on its last non-blank line.
        self.last_text = self.of(len(code.rstrip()) - 1)

    def of(self, offset: int) -> int:
        return max(bisect_left(self._newlines, offset + 1) - 1, 0)


def _closing_comment_prefix(text: str) -> int:
    """The end of a block comment the chunk starts inside (a ``*/`` ending its line before any ``/*``
    and any quote), else 0."""
    m = _CLOSING_COMMENT.search(text)
    if m is None:
        return 0
    head = text[: m.start()]
    return 0 if "/*" in head or any(q in head for q in "\"'`") else m.start() + 2


def _blank_prefix(code: str, end: int) -> str:
    return re.sub(r"[^\n]", " ", code[:end]) + code[end:]


def _closes_outer_brace(code: str) -> bool:
    depth = 0
    for m in _BRACE.finditer(code):
        depth += 1 if m.group() == "{" else -1
        if depth < 0:
            return True
    return False


def _first_line_indented(code: str, start: int) -> bool:
    for line in code[start:].split("\n"):
        if line.strip():
            return line[0] in " \t"
    return False


def header(pattern: str, kind: Kind, *, statement: bool = False, tail: Tail | None = None) -> Header:
    """A header pattern, written as if anchored at a line start (``^``). It is compiled to start with a
    literal line end instead, over text that starts with one: a literal prefix lets the regex engine jump
    from line to line instead of trying the pattern at every character. ``tail``: what must follow it."""
    assert pattern.startswith("^"), pattern
    return Header(re.compile("\n" + pattern[1:]), kind, statement, tail)
