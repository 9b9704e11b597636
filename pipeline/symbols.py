"""Which code symbols a chunk defines, and whether it holds them whole: regular expressions and
indentation, no parser, so that it can run on every chunk at ingest (about 0.1 ms for a chunk of 256
tokens, a fraction of what cutting the chunk costs). Header patterns use possessive quantifiers so that
long runs of blanks (comments are blanked first) cannot make them backtrack quadratically.

A chunk is judged by its own text. ``starts_mid_line`` says its first line is the tail of a line (chunks
start at token boundaries, so the previous chunk holds that line's head); ``ends_document`` says nothing
follows it, so a definition still open at its end is nevertheless whole.

What a definition is, per language:

- **Python**: ``def``/``async def``/``class`` at any depth (methods and nested functions included), and at
  column 0 ``UPPER_CASE`` constants, ``type X = ...`` and ``X: TypeAlias = ...``. A block ends at the next
  statement line indented no deeper than its header; lines that start inside brackets, inside a string or
  after a backslash continue a statement and are not statement lines.
- **Brace languages** (JavaScript/TypeScript, Go, Rust, Java, Kotlin, C#, C/C++): header patterns per
  language (functions, methods, classes/structs/enums/interfaces/traits, Rust ``impl`` named after its self
  type, upper-case constants, type aliases, ``const f = (...) =>``). String literals and comments are
  blanked first. A definition ends at the brace closing its body, at a ``;`` that ends a bodiless
  signature (interface and trait methods), or, for constants, aliases and arrow functions, at a ``;`` or
  at a line end outside brackets that no operator continues.

``symbols`` lists every definition found, in order, each name once. ``primary_symbol`` is the first
definition not nested in another definition of the same chunk, preferring functions and types over
constants. ``role`` describes the primary definition: ``complete`` when the chunk holds it from its header
to its end, ``declaration`` when the chunk holds its header but not its end; with no definition in the
chunk, ``body`` when the chunk continues one begun earlier (its first statement line is indented, or it
closes a brace it never opened), else ``None`` (prose, imports, top-level statements).

Limits, accepted for speed and kept honest here:

- Names are plain (``get``, not ``Cache.get``); a Python decorator is not part of its definition's span.
- A chunk that starts inside a string or comment is guessed at: a Python triple quote that looks like a
  closer, or a ``*/`` that ends its line before any ``/*``, marks the text before it as string/comment.
  A wrong guess swaps code and string for the rest of the chunk.
- A chunk that starts inside brackets (a call's arguments split across chunks) may see a Python dedent
  that is not one.
- Not understood: JavaScript regular-expression literals (a ``/{/`` counts as a brace), nested template
  literals, Rust nested block comments, C preprocessor branches that each open a brace, Go ``type (...)``
  and ``const (...)`` groups, C ``typedef struct {...} Name``, K&R C definitions, definitions without a
  return type or modifier before the name (C++ ``Widget::Widget() {``, package-private Java constructors),
  Kotlin bodiless classes followed by non-definition code, C#/Kotlin properties, Python definitions inside
  statements such as ``if TYPE_CHECKING:`` (found, but a chunk of that block counts as ``body``).
- JavaScript/TypeScript methods need a body: abstract methods and overload signatures (``run(x: T);``)
  look like calls and are not listed; nor are ``obj.f = function`` and ``module.exports.f = ...``.
- ``.h`` files are read as C++ (a superset of the C patterns).
- An indented first line is read as a continuation even when it only continues a top-level ``if`` block.
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Role(enum.StrEnum):
    COMPLETE = "complete"  # the chunk holds a whole definition, header to end
    DECLARATION = "declaration"  # its header/signature, but not its end
    BODY = "body"  # no header: it continues a definition begun in an earlier chunk


class Language(enum.StrEnum):
    PYTHON = "python"
    JAVASCRIPT = "javascript"
    TYPESCRIPT = "typescript"
    GO = "go"
    RUST = "rust"
    JAVA = "java"
    KOTLIN = "kotlin"
    CSHARP = "csharp"
    C = "c"
    CPP = "cpp"


_ROLES = {role.value: role for role in Role}


@dataclass(frozen=True, slots=True)
class ChunkSymbols:
    """What one chunk defines. Empty (no symbols, no role) for prose and for code that defines nothing."""

    symbols: tuple[str, ...] = ()
    primary_symbol: str | None = None
    role: Role | None = None

    def to_json(self) -> dict[str, Any] | None:
        """The stored and transported form, ``{"symbols", "primary", "role"}``; None when empty."""
        if not self.symbols and self.role is None:
            return None
        return {
            "symbols": list(self.symbols),
            "primary": self.primary_symbol,
            "role": None if self.role is None else self.role.value,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ChunkSymbols:
        """Inverse of :meth:`to_json`; an unknown role reads as None rather than failing a search."""
        if not data:
            return NO_SYMBOLS
        primary = data.get("primary")
        return cls(
            symbols=tuple(str(s) for s in data.get("symbols") or ()),
            primary_symbol=None if primary is None else str(primary),
            role=_ROLES.get(str(data.get("role"))),
        )


NO_SYMBOLS = ChunkSymbols()

_EXTENSIONS: dict[str, Language] = {
    **dict.fromkeys((".py", ".pyi", ".pyw"), Language.PYTHON),
    **dict.fromkeys((".js", ".jsx", ".mjs", ".cjs"), Language.JAVASCRIPT),
    **dict.fromkeys((".ts", ".tsx", ".mts", ".cts"), Language.TYPESCRIPT),
    ".go": Language.GO,
    ".rs": Language.RUST,
    ".java": Language.JAVA,
    **dict.fromkeys((".kt", ".kts"), Language.KOTLIN),
    ".cs": Language.CSHARP,
    ".c": Language.C,
    # A header may be C or C++: the C++ patterns are a superset.
    **dict.fromkeys((".h", ".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".h++", ".ipp"), Language.CPP),
}


def language_for(path: str) -> Language | None:
    """The language of a document by its file extension (case-insensitive), or None when not code."""
    name = path.rsplit("/", 1)[-1]
    dot = name.rfind(".")
    return _EXTENSIONS.get(name[dot:].lower()) if dot > 0 else None


def extract_symbols(
    text: str, *, language: str | None, starts_mid_line: bool = False, ends_document: bool = False
) -> ChunkSymbols:
    """The symbols ``text`` (one chunk of a document in ``language``) defines, its primary symbol and
    role. Unknown or absent languages give :data:`NO_SYMBOLS`. See the module docstring for the rules."""
    extractor = _EXTRACTORS.get(language) if language else None
    if extractor is None or not text:
        return NO_SYMBOLS
    return extractor.extract(text, starts_mid_line=starts_mid_line, ends_document=ends_document)


# -- shared ----------------------------------------------------------------------------------------------


class _Kind(enum.Enum):
    CALLABLE = "callable"
    TYPE = "type"
    CONSTANT = "constant"  # a symbol, but the primary only when the chunk defines nothing else


@dataclass(frozen=True, slots=True)
class _Definition:
    name: str
    kind: _Kind
    nested: bool  # inside another definition whose header is in this chunk
    closed: bool  # its end is inside the chunk


class _Extractor(Protocol):
    def extract(self, text: str, *, starts_mid_line: bool, ends_document: bool) -> ChunkSymbols: ...


def _summarise(definitions: list[_Definition], *, continues: bool, ends_document: bool) -> ChunkSymbols:
    outer = [d for d in definitions if not d.nested]
    if not outer:
        return ChunkSymbols(role=Role.BODY) if continues else NO_SYMBOLS
    primary = next((d for d in outer if d.kind is not _Kind.CONSTANT), outer[0])
    return ChunkSymbols(
        symbols=tuple(dict.fromkeys(d.name for d in definitions)),
        primary_symbol=primary.name,
        role=Role.COMPLETE if primary.closed or ends_document else Role.DECLARATION,
    )


# -- Python: blocks by indentation -----------------------------------------------------------------------

_PY_LEXEME = re.compile(
    r'(?P<s>"""(?:\\[\s\S]|[^\\])*?(?:"""|\Z)'
    r"|'''(?:\\[\s\S]|[^\\])*?(?:'''|\Z)"
    r'|"(?:\\.|[^"\\\n])*"?'
    r"|'(?:\\.|[^'\\\n])*'?)"
    r"|#[^\n]*"
    r"|(?P<o>[(\[{])|(?P<c>[)\]}])|(?P<n>\\?\n)"
)
_PY_DEF = re.compile(r"(?:async[ \t]+)?(?P<k>def|class)[ \t]+(?P<name>[^\W\d]\w*)")
_PY_CONSTANT = re.compile(
    r"(?:type[ \t]+(?P<alias>[^\W\d]\w*)[ \t]*(?:\[[^\]\n]*\])?[ \t]*="
    r"|(?P<typed>[^\W\d]\w*)[ \t]*:[ \t]*(?:typing\.)?TypeAlias\b"
    r"|(?P<const>_?[A-Z][A-Z0-9_]*)[ \t]*(?::[^=\n]*)?=(?!=))"
)
_TRIPLE = re.compile(r"\"\"\"|'''")
_OPENS_STRING = re.compile(r"(?:[=(\[{,:]|\breturn|\byield)\s*[rRbBuUfF]{0,2}$|^[rRbBuUfF]{1,2}$")


class _Python:
    def extract(self, text: str, *, starts_mid_line: bool, ends_document: bool) -> ChunkSymbols:
        code_start = _python_string_prefix(text)
        continued, open_at_end = _python_continued_lines(text, code_start)
        names: list[str] = []
        kinds: list[_Kind] = []
        nested: list[bool] = []
        closed: list[bool] = []
        stack: list[tuple[int, int]] = []  # (indent, definition index) of blocks still open
        first_indent: int | None = None
        for number, line in enumerate(text.split("\n")):
            if number in continued or (number == 0 and starts_mid_line):
                continue
            stripped = line.lstrip()
            if not stripped or stripped[0] == "#":
                continue
            indent = len(line[: len(line) - len(line.lstrip(" \t\f"))].expandtabs(8))
            if first_indent is None:
                first_indent = indent
            while stack and stack[-1][0] >= indent:
                closed[stack.pop()[1]] = True
            found = _python_definition(stripped, indent)
            if found is not None:
                names.append(found[0])
                kinds.append(found[1])
                nested.append(bool(stack))
                closed.append(False)
                stack.append((indent, len(names) - 1))
        # A one-statement definition (a constant, an alias) is whole once its statement is; a block may
        # still go on in the next chunk.
        if stack and not open_at_end and kinds[stack[-1][1]] is _Kind.CONSTANT:
            closed[stack[-1][1]] = True
        definitions = [_Definition(*fields) for fields in zip(names, kinds, nested, closed, strict=True)]
        continues = first_indent is not None and first_indent > 0
        return _summarise(definitions, continues=continues, ends_document=ends_document)


def _python_definition(stripped: str, indent: int) -> tuple[str, _Kind] | None:
    match = _PY_DEF.match(stripped)
    if match:
        return match["name"], _Kind.TYPE if match["k"] == "class" else _Kind.CALLABLE
    if indent == 0:
        match = _PY_CONSTANT.match(stripped)
        if match:
            alias = match["alias"] or match["typed"]
            return (alias, _Kind.TYPE) if alias else (match["const"], _Kind.CONSTANT)
    return None


def _python_continued_lines(text: str, code_start: int) -> tuple[set[int], bool]:
    """Line numbers (0-based) that start inside brackets, a string or after a backslash, and whether the
    text ends inside one of them."""
    line = text.count("\n", 0, code_start)
    continued = set(range(line + 1)) if code_start else set()
    depth = 0
    open_at_end = False
    for match in _PY_LEXEME.finditer(text, code_start):
        kind = match.lastgroup
        if kind == "n":
            line += 1
            if depth or len(match.group()) == 2:
                continued.add(line)
        elif kind == "s":
            lexeme = match.group()
            for _ in range(lexeme.count("\n")):
                line += 1
                continued.add(line)
            open_at_end = match.end() == len(text) and not _closes(lexeme)
        elif kind == "o":
            depth += 1
        elif kind == "c":
            depth = max(depth - 1, 0)  # a closer of a bracket opened before the chunk
    return continued, open_at_end or depth > 0 or text.endswith("\\\n")


def _closes(lexeme: str) -> bool:
    quote = lexeme[:3] if lexeme[:3] in ('"""', "'''") else lexeme[0]
    return len(lexeme) >= 2 * len(quote) and lexeme.endswith(quote)


def _python_string_prefix(text: str) -> int:
    """Where code starts when the chunk seems to start inside a triple-quoted string (else 0).

    Only an odd number of triple quotes raises the question. The first one opens a string when code that
    takes a value precedes it on its line (``x = \"\"\"``, ``return f\"\"\"``), when text follows it
    (``\"\"\"Summary.``), or, alone on its line, when the line before ends a header or an open
    expression (``def f():``, ``call(``); otherwise (``Summary.\"\"\"``, a lone closer) it is taken to close a
    string begun in an earlier chunk.
    """
    quotes = list(_TRIPLE.finditer(text))
    if len(quotes) % 2 == 0:
        return 0
    first = quotes[0]
    line_start = text.rfind("\n", 0, first.start()) + 1
    line_end = text.find("\n", first.end())
    before = text[line_start : first.start()].strip()
    after = text[first.end() : len(text) if line_end < 0 else line_end].strip()
    if before:
        opens = _OPENS_STRING.search(before) is not None
    elif after.strip("),;"):
        opens = True
    else:
        previous = text[: max(line_start - 1, 0)].rstrip().rsplit("\n", 1)[-1].rstrip()
        opens = previous.endswith((":", "(", "[", "{", ",", "="))
    return 0 if opens else first.end()


# -- brace languages: blanked strings and comments, then headers and brace balance ------------------------


@dataclass(frozen=True, slots=True)
class _Header:
    pattern: re.Pattern[str]
    kind: _Kind
    statement: bool  # ends at `;` or a line end (constants, aliases, arrow functions), not a closing brace


_TOKEN = re.compile(r"=>|[=!<>]=|[{}()\[\];=\n]")
# A line end continues a statement when the line ends in one of these, or the next line starts with one.
_CONTINUES_BEFORE = frozenset("=,([{+-*/%&|^?:<>!.")
_CONTINUES_AFTER = frozenset(".?:|&+=")
# Keywords that look like a name before `(`: `if (x) {`, `catch (e) {`, `else if (...)`.
_NOT_NAMES = frozenset({
    "if", "for", "while", "switch", "catch", "return", "sizeof", "else", "do", "new", "delete", "throw",
    "function", "typeof", "await", "yield", "super", "this", "with", "case", "using", "lock", "fixed",
    "foreach", "synchronized", "assert", "try", "finally", "instanceof", "alignof", "decltype",
    "static_assert", "defined", "when", "match", "elif",
})  # fmt: skip
# Words that make `word name(...)` a statement rather than a header: `return f(x);`, `new Foo(x) {`.
_NOT_BEFORE_NAME = frozenset({
    "return", "new", "else", "throw", "await", "yield", "case", "goto", "typeof", "delete", "assert", "using",
    "import",
})  # fmt: skip
_BRACE = re.compile(r"[{}]")
_CLOSING_COMMENT = re.compile(r"\*/[ \t\r]*(?:\n|\Z)")


@dataclass(frozen=True, slots=True)
class _Tokens:
    """Brackets, semicolons, ``=`` and line ends of blanked text, with the depths before each."""

    pos: list[int]
    tok: list[str]
    paren: list[int]
    brace: list[int]
    match: list[int]  # for a "{": the index of its "}", or -1 when it closes after the chunk
    closes_outer: bool  # a "}" closes a brace opened before the chunk

    @classmethod
    def scan(cls, code: str) -> _Tokens:
        pos: list[int] = []
        tok: list[str] = []
        paren: list[int] = []
        brace: list[int] = []
        match: list[int] = []
        opened: list[int] = []
        p = b = 0
        closes_outer = False
        for m in _TOKEN.finditer(code):
            t = m.group()
            pos.append(m.start())
            tok.append(t)
            paren.append(p)
            brace.append(b)
            match.append(-1)
            if t == "{":
                opened.append(len(tok) - 1)
                b += 1
            elif t == "}":
                b -= 1
                if opened:
                    match[opened.pop()] = len(tok) - 1
                else:
                    closes_outer = True
            elif t in ("(", "["):
                p += 1
            elif t in (")", "]"):
                p -= 1
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
                    if j < 0:
                        return None
                    if not statement:
                        return self.pos[j] + 1
                    i = j
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


def _blank(match: re.Match[str]) -> str:
    """A string or comment as spaces, keeping its line ends so that offsets and lines do not move."""
    s = match.group()
    return " " * len(s) if "\n" not in s else "\n".join(" " * len(part) for part in s.split("\n"))


@dataclass(frozen=True, slots=True)
class _BraceLanguage:
    literals: re.Pattern[str]  # strings and comments
    headers: tuple[_Header, ...]

    def extract(self, text: str, *, starts_mid_line: bool, ends_document: bool) -> ChunkSymbols:
        # One line end before the text: headers are found by patterns starting with a line end (see `_h`),
        # and every offset below is into `code`.
        code = "\n" + self.literals.sub(_blank, text)
        comment_end = _closing_comment_prefix(text)
        if comment_end:
            code = _blank_prefix(code, comment_end + 1)
        # A first line that is the tail of a line cannot start a header.
        first_line_end = code.find("\n", 1) if starts_mid_line else 0
        if first_line_end < 0:
            first_line_end = len(code)
        found: dict[int, tuple[int, int, str, _Header]] = {}  # by name start: (start, name end, name, header)
        for header in self.headers:
            for m in header.pattern.finditer(code, first_line_end):
                name = m["name"]
                if name in _NOT_NAMES or m.start("name") in found:
                    continue
                if not _NOT_BEFORE_NAME.isdisjoint(code[m.start() : m.start("name")].split()):
                    continue
                found[m.start("name")] = (m.start(), m.end("name"), name, header)
        indented = _first_line_indented(code, first_line_end)
        if not found:  # the common case of a chunk inside a long body: no extents to find
            return ChunkSymbols(role=Role.BODY) if indented or _closes_outer_brace(code) else NO_SYMBOLS
        tokens = _Tokens.scan(code)
        ordered = sorted(found.values())
        starts = [start for start, *_ in ordered]
        definitions: list[_Definition] = []
        open_ends: list[int | None] = []  # ends of the definitions enclosing the current one
        for start, name_end, name, header in ordered:
            following = bisect_left(starts, name_end)
            stop = starts[following] if following < len(starts) else len(code)
            end = tokens.end_of(code, name_end, statement=header.statement, stop=stop)
            while open_ends and open_ends[-1] is not None and open_ends[-1] <= start:
                open_ends.pop()
            definitions.append(_Definition(name, header.kind, nested=bool(open_ends), closed=end is not None))
            open_ends.append(end)
        return _summarise(
            definitions,
            continues=indented or tokens.closes_outer,
            ends_document=ends_document,
        )


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


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.MULTILINE)


# Comments and strings per family. Unterminated single-line strings run to the line end, block comments
# and multi-line strings to the chunk's end.
_SLASH_COMMENTS = r"//[^\n]*|/\*[\s\S]*?(?:\*/|\Z)"
_QUOTED = r"\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?"
_JS_LITERALS = _rx(_SLASH_COMMENTS + r"|`(?:\\[\s\S]|[^`\\])*`?|" + _QUOTED)
_GO_LITERALS = _rx(_SLASH_COMMENTS + r"|`[^`]*`?|" + _QUOTED)
_RUST_LITERALS = _rx(
    _SLASH_COMMENTS + r"|\br(#*)\"[\s\S]*?(?:\"\1|\Z)|b?\"(?:\\[\s\S]|[^\"\\])*\"?"
    # Char literals are one character or escape, so a lifetime ('a) is not taken for one.
    r"|b?'(?:\\(?:u\{[0-9a-fA-F]{1,6}\}|x[0-9a-fA-F]{2}|.)|[^'\\\n])'"
)
_JVM_LITERALS = _rx(_SLASH_COMMENTS + r"|\"\"\"[\s\S]*?(?:\"\"\"|\Z)|@\"(?:\"\"|[^\"])*\"?|" + _QUOTED)
_C_LITERALS = _rx(
    _SLASH_COMMENTS + r"|^[ \t]*#(?:\\[\s\S]|[^\n\\])*|\bR\"([^(\s]*)\([\s\S]*?\)\1\"|" + _QUOTED
)

_ID = r"[A-Za-z_$][\w$]*"
# One level of nested brackets is enough for parameter lists in practice (defaults, annotations).
_PARAMS = r"\((?:[^(){};]|\([^(){};]*\)|\{[^(){};]*\})*\)"
# Modifiers and a return type, possibly over several lines; bounded, so that a long run of words (an enum's
# values) is not rescanned from every line.
_TYPE_WORDS = r"(?:[\w$:<>,.?*&~\[\]]+\s++){1,8}[*&]*"
_RUST_VIS = r"(?:pub(?:\([^)\n]*\))?\s++)?"
_UPPER = r"_?[A-Z][A-Z0-9_]*"


def _h(pattern: str, kind: _Kind, *, statement: bool = False) -> _Header:
    """A header pattern, written as if anchored at a line start (``^``). It is compiled to start with a
    literal line end instead, over text that starts with one: a literal prefix lets the regex engine jump
    from line to line instead of trying the pattern at every character."""
    assert pattern.startswith("^"), pattern
    return _Header(re.compile("\n" + pattern[1:]), kind, statement)


_JS_HEADERS = (
    _h(
        rf"^[ \t]*+(?:export\s++)?(?:default\s++)?(?:async\s++)?function\b\s*+(?:\*\s*+)?(?P<name>{_ID})",
        _Kind.CALLABLE,
    ),
    _h(
        r"^[ \t]*+(?:export\s++)?(?:default\s++)?(?:declare\s++)?(?:abstract\s++)?"
        rf"(?:class|interface|(?:const\s++)?enum)\s++(?P<name>{_ID})",
        _Kind.TYPE,
    ),
    _h(
        rf"^[ \t]*+(?:export\s++)?(?:const|let|var)\s++(?P<name>{_ID})\s*+(?::[^=\n]+)?=\s*+(?:async\s++)?"
        rf"(?:function\b|(?:\((?:[^()]|\([^()]*\))*\)|{_ID})\s*+(?::[^=\n]+)?=>)",
        _Kind.CALLABLE,
        statement=True,
    ),
    _h(rf"^(?:export\s++)?(?:declare\s++)?type\s++(?P<name>{_ID})\s*+(?:<[^=\n]*>)?\s*+=", _Kind.TYPE, statement=True),
    _h(rf"^(?:export\s++)?const\s++(?P<name>{_UPPER})\b\s*+(?::[^=\n]+)?=(?!=)", _Kind.CONSTANT, statement=True),
    # Methods (class bodies, object literals): indented, a parameter list, then a body.
    _h(
        r"^[ \t]++(?:(?:static|async|get|set|public|private|protected|readonly|override|abstract)\s++)*(?:\*\s*+)?"
        rf"(?P<name>#?{_ID})\s*+(?:<[^<>()\n]*>)?\s*+{_PARAMS}\s*+(?::\s*+[^{{}};=()]+)?\{{",
        _Kind.CALLABLE,
    ),
)

_GO_HEADERS = (
    _h(r"^func\s*+(?:\([^()]*\)\s*+)?(?P<name>[A-Za-z_]\w*)", _Kind.CALLABLE),
    _h(r"^type\s++(?P<name>[A-Za-z_]\w*)\b", _Kind.TYPE, statement=True),
    _h(r"^const\s++(?P<name>[A-Za-z_]\w*)\b", _Kind.CONSTANT, statement=True),
)

_RUST_HEADERS = (
    _h(
        rf"^[ \t]*+{_RUST_VIS}(?:(?:const|async|unsafe|default|extern)\s++)*fn\s++(?P<name>[A-Za-z_]\w*)",
        _Kind.CALLABLE,
    ),
    _h(rf"^[ \t]*+{_RUST_VIS}(?:struct|enum|trait|union)\s++(?P<name>[A-Za-z_]\w*)", _Kind.TYPE),
    # An impl is named after its self type: `impl<T> fmt::Display for Wrapper<T>` defines Wrapper's methods.
    _h(
        r"^[ \t]*+(?:unsafe\s++)?impl\b(?:\s*+<[^{;]*?>)?\s++(?:[^{;]*?\s++for\s++)?(?:&\s*+)?(?:dyn\s++)?"
        r"(?:[A-Za-z_]\w*::)*(?P<name>[A-Za-z_]\w*)",
        _Kind.TYPE,
    ),
    _h(rf"^[ \t]*+{_RUST_VIS}type\s++(?P<name>[A-Za-z_]\w*)", _Kind.TYPE, statement=True),
    _h(rf"^[ \t]*+{_RUST_VIS}(?:const|static)\s++(?:mut\s++)?(?P<name>{_UPPER})\s*+:", _Kind.CONSTANT, statement=True),
)

_JVM_CLASS = _h(
    rf"^[ \t]*+(?:[a-z]+\s++)*(?:class|interface|enum|struct|record|object|@interface)\s++(?P<name>{_ID})", _Kind.TYPE
)
_JAVA_HEADERS = (
    _JVM_CLASS,
    # A method: annotations, modifiers and a return type, a name, parameters, `throws`, then a body, a `;`
    # (abstract and interface methods) or `=>` (C# expression bodies).
    _h(
        rf"^[ \t]*+(?:@\w+(?:\([^()\n]*\))?\s++)*{_TYPE_WORDS}(?P<name>{_ID})\s*+{_PARAMS}"
        r"(?:[^(){};=]|\([^(){};]*\))*?(?:\{|;|=>)",
        _Kind.CALLABLE,
    ),
    _h(
        r"^[ \t]*+(?:[a-z]+\s++)*(?:static\s++final|final\s++static|const)\s++[\w<>\[\],.?]+\s++"
        rf"(?P<name>{_ID})\s*+=(?!=)",
        _Kind.CONSTANT,
        statement=True,
    ),
)
_KOTLIN_HEADERS = (
    _JVM_CLASS,
    _h(
        rf"^[ \t]*+(?:[a-z]+\s++)*fun\s++(?:<[^>\n]*>\s*+)?(?:[\w.]+\.)?(?P<name>{_ID})",
        _Kind.CALLABLE,
    ),
    _h(rf"^[ \t]*+(?:[a-z]+\s++)*const\s++val\s++(?P<name>{_ID})", _Kind.CONSTANT, statement=True),
)
_CPP_HEADERS = (
    # Only definitions with a body: `class Foo;` and `struct foo *f()` are not definitions of Foo/foo.
    _h(
        r"^[ \t]*+(?:template\s*+<[^;{}]*>\s*+)?(?:typedef\s++)?(?:class|struct|union|enum(?:\s++class)?)\s++"
        r"(?:[A-Za-z_]\w*\s++)?(?P<name>[A-Za-z_]\w*)(?=\s*+(?:final\s*+)?(?::[^;{}]*)?\{)",
        _Kind.TYPE,
    ),
    _h(
        rf"^[ \t]*+{_TYPE_WORDS}(?:[A-Za-z_]\w*(?:<[^<>;{{}}()]*>)?::)*(?P<name>~?[A-Za-z_]\w*)\s*+{_PARAMS}"
        r"(?:[^(){};=]|\([^(){};]*\))*?\{",
        _Kind.CALLABLE,
    ),
    _h(
        r"^(?:static\s++)?(?:constexpr|const)\s++[\w:<>]+\s++(?P<name>[A-Za-z_]\w*)\s*+(?:\[[^\]]*\])?\s*+=(?!=)",
        _Kind.CONSTANT,
        statement=True,
    ),
)

_JS = _BraceLanguage(_JS_LITERALS, _JS_HEADERS)
_JVM = _BraceLanguage(_JVM_LITERALS, _JAVA_HEADERS)
_CPP = _BraceLanguage(_C_LITERALS, _CPP_HEADERS)
_EXTRACTORS: dict[str, _Extractor] = {
    Language.PYTHON: _Python(),
    Language.JAVASCRIPT: _JS,
    Language.TYPESCRIPT: _JS,
    Language.GO: _BraceLanguage(_GO_LITERALS, _GO_HEADERS),
    Language.RUST: _BraceLanguage(_RUST_LITERALS, _RUST_HEADERS),
    Language.JAVA: _JVM,
    Language.CSHARP: _JVM,
    Language.KOTLIN: _BraceLanguage(_JVM_LITERALS, _KOTLIN_HEADERS),
    Language.C: _CPP,
    Language.CPP: _CPP,
}
