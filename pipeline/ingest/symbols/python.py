"""Python: definitions found line by line, blocks ended by indentation (see the package docstring)."""

from __future__ import annotations

import re

from shardfuse.pipeline.ingest.symbols.model import ChunkSymbols, Definition, Kind, summarise

_PY_LEXEME = re.compile(
    r'(?P<s>"""(?:\\[\s\S]|[^\\])*?(?:"""|\Z)'
    r"|'''(?:\\[\s\S]|[^\\])*?(?:'''|\Z)"
    r'|"(?:\\.|[^"\\\n])*"?'
    r"|'(?:\\.|[^'\\\n])*'?)"
    r"|#[^\n]*"
    r"|(?P<o>[(\[{]+)|(?P<c>[)\]}]+)|(?P<n>\\?\n)"  # runs of openers or closers: one step, not one a bracket
)
_PY_DEF = re.compile(r"(?:async[ \t]+)?(?P<k>def|class)[ \t]+(?P<name>[^\W\d]\w*)")
_PY_CONSTANT = re.compile(
    r"(?:type[ \t]+(?P<alias>[^\W\d]\w*)[ \t]*(?:\[[^\]\n]*\])?[ \t]*="
    r"|(?P<typed>[^\W\d]\w*)[ \t]*:[ \t]*(?:typing\.)?TypeAlias\b"
    r"|(?P<const>_?[A-Z][A-Z0-9_]*)[ \t]*(?::[^=\n]*)?=(?!=))"
)
_TRIPLE = re.compile(r"\"\"\"|'''")
_OPENS_STRING = re.compile(r"(?:[=(\[{,:]|\breturn|\byield)\s*[rRbBuUfF]{0,2}$|^[rRbBuUfF]{1,2}$")


class PythonExtractor:
    def extract(self, text: str, *, starts_mid_line: bool, ends_document: bool) -> ChunkSymbols:
        code_start = _python_string_prefix(text)
        continued, open_at_end = _python_continued_lines(text, code_start)
        found: list[_Found] = []
        stack: list[_Found] = []  # blocks still open, innermost last
        first_indent: int | None = None
        last_code = last_text = 0  # the last line holding code, and holding anything but blanks
        for number, line in enumerate(text.split("\n")):
            stripped = line.lstrip()
            if stripped:
                last_text = number
            if number in continued or (number == 0 and starts_mid_line):
                last_code = number if stripped else last_code
                continue
            if not stripped or stripped[0] == "#":
                continue
            indent = len(line[: len(line) - len(line.lstrip(" \t\f"))].expandtabs(8))
            if first_indent is None:
                first_indent = indent
            while stack and stack[-1].indent >= indent:
                stack.pop().close(last_code)
            definition = _python_definition(stripped, indent)
            if definition is not None:
                found.append(_Found(*definition, indent=indent, first=number, nested=bool(stack)))
                stack.append(found[-1])
            last_code = number
        # A one-statement definition (a constant, an alias) is whole once its statement is; a block may
        # still go on in the next chunk.
        if stack and not open_at_end and stack[-1].kind is Kind.CONSTANT:
            stack.pop().close(last_code)
        definitions = [f.definition(last_text) for f in found]
        continues = first_indent is not None and first_indent > 0
        return summarise(definitions, continues=continues, ends_document=ends_document)


class _Found:
    """A definition while its chunk is read: where it starts, and where it ends once a dedent closes it."""

    __slots__ = ("first", "indent", "kind", "last", "name", "nested")

    def __init__(self, name: str, kind: Kind, *, indent: int, first: int, nested: bool) -> None:
        self.name, self.kind, self.indent, self.first, self.nested = name, kind, indent, first, nested
        self.last: int | None = None

    def close(self, last_code: int) -> None:
        self.last = max(last_code, self.first)

    def definition(self, last_text: int) -> Definition:
        """As found; one still open ends on the chunk's last non-blank line."""
        last = self.last if self.last is not None else max(last_text, self.first)
        return Definition(self.name, self.kind, self.nested, self.last is not None, (self.first, last))


def _python_definition(stripped: str, indent: int) -> tuple[str, Kind] | None:
    match = _PY_DEF.match(stripped)
    if match:
        return match["name"], Kind.TYPE if match["k"] == "class" else Kind.CALLABLE
    if indent == 0:
        match = _PY_CONSTANT.match(stripped)
        if match:
            alias = match["alias"] or match["typed"]
            return (alias, Kind.TYPE) if alias else (match["const"], Kind.CONSTANT)
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
            depth += len(match.group())
        elif kind == "c":
            depth = max(depth - len(match.group()), 0)  # closers of brackets opened before the chunk count 0
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
