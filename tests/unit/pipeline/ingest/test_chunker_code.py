"""code_spans: source code cut at its definitions, on real files of this repository and one realistic file per
brace language (tests/fixtures/code), with the span guarantees checked on every result."""

from __future__ import annotations

import ast
import re
from textwrap import dedent

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.base import ChunkBudget, Span
from shardfuse.pipeline.ingest.chunkers.code import code_spans
from shardfuse.pipeline.ingest.chunkers.code_units import layout
from shardfuse.pipeline.ingest.symbols import Role
from tests.support.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "code"
REPOSITORY_FILES = [
    "pipeline/ingest/chunkers/token_windows.py",
    "pipeline/index/store/shard_store.py",
    "query/search.py",
    "pipeline/ingest/symbols/braces.py",
]
FIXTURE_LANGUAGES = {
    "event_bus.js": "javascript",
    "rate_limiter.ts": "typescript",
    "lru_cache.go": "go",
    "OrderService.java": "java",
    "tokenizer.rs": "rust",
    "ring_buffer.c": "c",
    "matrix.cpp": "cpp",
}


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def _spans(text: str, language: str, counter: TokenCounter, max_tokens: int) -> list[Span]:
    budget = ChunkBudget(max_tokens=max_tokens, overlap_tokens=0)
    return code_spans(text, language=language, counter=counter, budget=budget)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _lines_of(text: str, span: Span) -> range:
    return range(_line(text, span.start), _line(text, span.end - 1) + 1)


def assert_invariants(
    text: str, spans: list[Span], counter: TokenCounter, max_tokens: int, *, parsed: bool = True
) -> None:
    """In order, not overlapping, covering every non-whitespace character, within the budget, line-aligned
    (when every line fits the budget), and (for code that parses) symbols that agree with the role."""
    assert spans, "code with non-whitespace text must give spans"
    assert not text[: spans[0].start].strip()
    assert not text[spans[-1].end :].strip()
    lines_fit = max(counter.count(line) for line in text.split("\n")) < max_tokens  # "\n" may join a token
    for i, span in enumerate(spans):
        piece = text[span.start : span.end]
        assert 0 <= span.start < span.end <= len(text)
        assert piece.strip(), "no whitespace-only span"
        assert counter.count(piece) <= max_tokens
        if i:
            assert spans[i - 1].end <= span.start, "in order, not overlapping"
            assert not text[spans[i - 1].end : span.start].strip(), "only whitespace between spans"
        if lines_fit:
            assert span.start == 0 or text[span.start - 1] == "\n"
            assert span.end == len(text) or text[span.end - 1] == "\n"
        symbols = span.symbols
        assert len(set(symbols.symbols)) == len(symbols.symbols)
        if not parsed:
            continue
        if symbols.role is None:
            assert symbols.primary_symbol is None and not symbols.symbols
        else:
            assert symbols.primary_symbol is not None
        if symbols.role in (Role.COMPLETE, Role.MIXED):
            assert symbols.primary_symbol in symbols.symbols
        if symbols.role is Role.DECLARATION and symbols.primary_symbol not in symbols.symbols:
            # comments (or a template line) above a header that the next span declares
            following = spans[i + 1].symbols
            assert (following.role, following.primary_symbol) == (Role.DECLARATION, symbols.primary_symbol)


# -- Python files of this repository ---------------------------------------------------------------------


@pytest.mark.parametrize("path", REPOSITORY_FILES)
@pytest.mark.parametrize("max_tokens", [64, 256, 512])
def test_repository_python_files_keep_the_invariants(path: str, max_tokens: int, counter: TokenCounter) -> None:
    text = (REPO / path).read_text(encoding="utf-8")
    assert_invariants(text, _spans(text, "python", counter, max_tokens), counter, max_tokens)


def test_a_function_that_fits_is_one_complete_span(counter: TokenCounter) -> None:
    text = (REPO / "pipeline/ingest/chunkers/token_windows.py").read_text(encoding="utf-8")
    function = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "chunk_text")
    spans = _spans(text, "python", counter, 512)
    (span,) = [s for s in spans if s.symbols.primary_symbol == "chunk_text"]
    assert span.symbols.role is Role.COMPLETE
    assert span.symbols.symbols == ("chunk_text",)
    assert function.lineno in _lines_of(text, span)
    assert function.end_lineno in _lines_of(text, span)
    assert text.splitlines()[_line(text, span.start) - 1].startswith("def chunk_text(")


def test_a_class_over_the_budget_is_split_at_its_methods(counter: TokenCounter) -> None:
    text = (REPO / "pipeline/index/store/shard_store.py").read_text(encoding="utf-8")
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "ShardStore")
    lines = text.splitlines(keepends=True)
    assert counter.count("".join(lines[cls.lineno - 1 : cls.end_lineno])) > 256
    spans = _spans(text, "python", counter, 256)
    pieces = [s for s in spans if s.symbols.primary_symbol == "ShardStore"]
    assert len(pieces) > 1
    assert pieces[0].symbols.role is Role.DECLARATION
    assert cls.lineno in _lines_of(text, pieces[0])
    assert all(p.symbols.role is Role.BODY for p in pieces[1:])
    assert _lines_of(text, pieces[0]).start <= cls.lineno and cls.end_lineno in _lines_of(text, pieces[-1])
    listed = [name for p in pieces for name in p.symbols.symbols]
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for method in methods:
        holder = next(p for p in pieces if method.lineno in _lines_of(text, p))
        assert method.name in holder.symbols.symbols
        first = min([method.lineno, *(d.lineno for d in method.decorator_list)])
        if counter.count("".join(lines[first - 1 : method.end_lineno])) < 240:  # fits: never cut
            assert first in _lines_of(text, holder) and method.end_lineno in _lines_of(text, holder)
    assert set(listed) >= {m.name for m in methods}


DECORATED = dedent('''
    """Fetching and parsing, each behind a decorator."""

    import functools

    import httpx


    # Cache parsed documents: parsing is pure, and the same URL is parsed many times.
    # The cache is unbounded on purpose (see the module docstring).
    @functools.lru_cache(maxsize=None)
    @staticmethod
    def parse(raw: bytes) -> dict[str, str]:
        fields = {}
        for line in raw.decode("utf-8").splitlines():
            key, _, value = line.partition("=")
            fields[key.strip()] = value.strip()
        return fields


    # Retry three times: the upstream service drops one request in a hundred.
    @retry(times=3, on=(httpx.TransportError,))
    async def fetch(client: httpx.AsyncClient, url: str) -> bytes:
        response = await client.get(url, timeout=10.0)
        response.raise_for_status()
        return response.content
''').lstrip()


@pytest.mark.parametrize("max_tokens", [64, 96, 128, 512])
def test_decorators_and_a_leading_comment_stay_with_their_function(max_tokens: int, counter: TokenCounter) -> None:
    spans = _spans(DECORATED, "python", counter, max_tokens)
    assert_invariants(DECORATED, spans, counter, max_tokens)
    lines = DECORATED.splitlines()
    for comment, def_line in (("# Cache parsed", "def parse("), ("# Retry three", "async def fetch(")):
        first = next(i for i, line in enumerate(lines, 1) if line.startswith(comment))
        header = next(i for i, line in enumerate(lines, 1) if line.startswith(def_line))
        holder = next(s for s in spans if header in _lines_of(DECORATED, s))
        assert first in _lines_of(DECORATED, holder), f"{comment!r} is cut from its function at {max_tokens}"


def test_a_decorated_function_alone_starts_at_its_comment(counter: TokenCounter) -> None:
    spans = _spans(DECORATED, "python", counter, 112)  # parse fits, and does not fit with the imports
    (parse,) = [s for s in spans if s.symbols.primary_symbol == "parse"]
    assert DECORATED[parse.start :].startswith("# Cache parsed documents")
    assert parse.symbols.role is Role.COMPLETE
    (imports,) = [s for s in spans if "import httpx" in DECORATED[s.start : s.end]]
    assert imports.symbols.role is None and imports.symbols.symbols == ()


SMALL_FUNCTIONS = dedent("""
    def add(a: int, b: int) -> int:
        return a + b


    def sub(a: int, b: int) -> int:
        return a - b


    class Point:
        x: int = 0
        y: int = 0

        def norm(self) -> float:
            return (self.x**2 + self.y**2) ** 0.5


    async def ping() -> str:
        return "pong"
""").lstrip()


def test_small_definitions_merge_into_one_mixed_span(counter: TokenCounter) -> None:
    (span,) = _spans(SMALL_FUNCTIONS, "python", counter, 512)
    assert (span.start, span.end) == (0, len(SMALL_FUNCTIONS))
    assert span.symbols.role is Role.MIXED
    assert span.symbols.primary_symbol == "add"
    assert span.symbols.symbols == ("add", "sub", "Point", "norm", "ping")


def test_complete_allows_comments_around_a_definition_but_not_other_code(counter: TokenCounter) -> None:
    commented = "# A license header.\n\n" + SMALL_FUNCTIONS.split("\n\n\n")[0] + "\n\n# Trailing note.\n"
    (span,) = _spans(commented, "python", counter, 512)
    assert span.symbols.role is Role.COMPLETE and span.symbols.primary_symbol == "add"
    with_code = "import math\n\n" + SMALL_FUNCTIONS.split("\n\n\n")[0] + "\n"
    (span,) = _spans(with_code, "python", counter, 512)
    assert span.symbols.role is Role.MIXED and span.symbols.symbols == ("add",)


def test_a_large_function_without_methods_is_cut_at_lines(counter: TokenCounter) -> None:
    body = "".join(f"    total += item_{i} * weight_{i}\n" + ("\n" if i % 3 == 2 else "") for i in range(60))
    text = f"def score(items):\n    total = 0\n{body}    return total\n\n\nVERSION = 3\n"
    spans = _spans(text, "python", counter, 64)
    assert_invariants(text, spans, counter, 64)
    pieces = [s for s in spans if s.symbols.primary_symbol == "score"]
    assert [p.symbols.role for p in pieces] == [Role.DECLARATION] + [Role.BODY] * (len(pieces) - 1)
    assert pieces[0].symbols.symbols == ("score",) and all(p.symbols.symbols == () for p in pieces[1:])
    assert all(text[p.start : p.end].endswith("\n\n") for p in pieces[:-1]), "cut after blank lines"
    assert spans[-1].symbols.role is None  # the constant is code, not a definition


def test_python_that_does_not_parse_falls_back_to_line_windows(counter: TokenCounter) -> None:
    text = (REPO / "pipeline/ingest/chunkers/token_windows.py").read_text(encoding="utf-8")
    text += "\ndef broken(:\n    pass\n"
    with pytest.raises(SyntaxError):
        ast.parse(text)
    for max_tokens in (64, 256):
        spans = _spans(text, "python", counter, max_tokens)
        assert_invariants(text, spans, counter, max_tokens, parsed=False)
    assert any("chunk_text" in s.symbols.symbols for s in spans)  # read per span by shardfuse.pipeline.ingest.symbols


def test_a_5000_line_python_file_keeps_the_invariants(counter: TokenCounter) -> None:
    source = (REPO / "pipeline/index/store/shard_store.py").read_text(encoding="utf-8")
    text = ""
    while text.count("\n") < 5000:
        text += source + "\n\n"
    assert layout(text, "python").parsed
    spans = _spans(text, "python", counter, 256)
    assert_invariants(text, spans, counter, 256)


def test_unknown_language_and_blank_text(counter: TokenCounter) -> None:
    with pytest.raises(ValueError, match="cobol"):
        _spans("MOVE 1 TO X.\n", "cobol", counter, 256)
    with pytest.raises(ValueError, match="cobol"):
        _spans("", "cobol", counter, 256)
    assert _spans("", "python", counter, 256) == []
    assert _spans(" \n\t\n  \n", "python", counter, 256) == []
    assert _spans("\n\n", "rust", counter, 256) == []


_FRAGMENTS = [
    "{", "}", "(", ")", ";", "\n", "\n\n", "    ", '"{"', "'}'", "`{`", "// }", "/* { */", "#[derive(Debug)]\n",
    "@Override\n", "fn f()", "function g()", "class A", "struct S", "impl T for U", "namespace n", "mod m",
    "int main(void)", "func (c *C) M()", "type T struct", "const X = 1", "export const k = (a) =>", "def h():",
    "    return 1", "async def a():", "@dec", "class B:", "pass", "if x:", "é", "\r\n", "x = 1",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    fragments=st.lists(st.sampled_from(_FRAGMENTS), max_size=80),
    language=st.sampled_from(["python", *FIXTURE_LANGUAGES.values(), "csharp", "kotlin"]),
    max_tokens=st.sampled_from([16, 24, 48, 128]),
)
def test_any_code_like_text_keeps_the_span_guarantees(
    counter: TokenCounter, fragments: list[str], language: str, max_tokens: int
) -> None:
    """Unbalanced braces, unclosed strings and comments, Python that does not parse: coverage, order and budget
    hold whatever the text."""
    text = " ".join(fragments)
    spans = _spans(text, language, counter, max_tokens)
    if not text.strip():
        assert spans == []
        return
    assert_invariants(text, spans, counter, max_tokens, parsed=layout(text, language).parsed)


# -- brace languages -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_LANGUAGES)
@pytest.mark.parametrize("max_tokens", [16, 64, 256, 512])
def test_fixtures_keep_the_invariants(name: str, max_tokens: int, counter: TokenCounter) -> None:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    assert 60 <= text.count("\n") <= 150
    assert_invariants(text, _spans(text, FIXTURE_LANGUAGES[name], counter, max_tokens), counter, max_tokens)


@pytest.mark.parametrize(
    ("name", "symbol", "max_tokens"),
    [
        ("event_bus.js", "formatTemplate", 256),
        ("rate_limiter.ts", "createLimiter", 64),
        ("lru_cache.go", "Stats", 128),
        ("OrderService.java", "OrderService", 512),
        ("tokenizer.rs", "round_trips_escaped_braces", 128),
        ("ring_buffer.c", "ring_error", 128),
        ("matrix.cpp", "Matrix", 256),
        ("matrix.cpp", "to_string", 256),  # defined out of its class: `std::string Matrix::to_string() const {`
    ],
)
def test_a_fixture_definition_is_one_complete_span(
    name: str, symbol: str, max_tokens: int, counter: TokenCounter
) -> None:
    """Each of these definitions holds braces in strings or comments; its span still runs from its header to
    its own closing brace."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    spans = _spans(text, FIXTURE_LANGUAGES[name], counter, max_tokens)
    (span,) = [s for s in spans if s.symbols.primary_symbol == symbol and s.symbols.role is Role.COMPLETE]
    header, closing = _extent(text.splitlines(), symbol, after=_line(text, span.start))
    assert header in _lines_of(text, span) and closing in _lines_of(text, span)
    assert not text[span.end :].startswith(("}", ";")), "ends after its closing line"


# Top-level definitions of each fixture, in order: an impl block is named after its type.
FIXTURE_DEFINITIONS = {
    "event_bus.js": ["formatTemplate", "EventBus", "debounce", "createBus"],
    "rate_limiter.ts": [
        "RateLimitConfig", "Decision", "LimitState", "TokenBucket", "describeLimit", "createLimiter", "withLimit",
    ],
    "lru_cache.go": ["Entry", "Cache", "NewCache", "Get", "Put", "Stats", "RenderKey"],
    "OrderService.java": ["OrderRepository", "OrderLine", "Order", "InMemoryOrders", "OrderService"],
    "tokenizer.rs": [
        "Token", "TokenizeError", "TokenizeError", "Lexer", "Lexer", "render", "round_trips_escaped_braces",
    ],
    "ring_buffer.c": [
        "ring_buffer", "ring_slot", "ring_init", "ring_push", "ring_pop", "ring_dump", "ring_error", "main",
    ],
    "matrix.cpp": ["Matrix", "to_string", "multiply", "clamp", "main"],
}  # fmt: skip


@pytest.mark.parametrize("name", FIXTURE_DEFINITIONS)
def test_fixture_definitions_end_at_their_own_closing_brace(name: str) -> None:
    """Braces in strings, characters and comments neither end a definition early nor make it run on: each unit
    ends on the first line after its header that closes a brace at the header's indentation."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    units = [u for u in layout(text, FIXTURE_LANGUAGES[name]).units if u.name]
    assert [u.name for u in units] == FIXTURE_DEFINITIONS[name]
    lines = text.splitlines()
    for unit in units:
        last = _line(text, unit.end - 1)
        while not lines[last - 1].strip():
            last -= 1
        header, closing = _extent(lines, unit.name or "", after=_line(text, unit.start))
        assert _line(text, unit.start) <= header and last == closing, (unit.name, header, closing, last)


def test_attributes_and_doc_comments_stay_with_their_definition() -> None:
    text = (FIXTURES / "tokenizer.rs").read_text(encoding="utf-8")
    token = next(u for u in layout(text, "rust").units if u.name == "Token")
    assert text[token.start :].startswith("/// One token of a template.\n#[derive(Debug, Clone, PartialEq, Eq)]\n")
    java = (FIXTURES / "OrderService.java").read_text(encoding="utf-8")
    service = next(u for u in layout(java, "java").units if u.name == "OrderService")
    assert java[service.start :].startswith("/**\n * Places and prices orders.")
    members = [p.name for p in service.parts if p.name]
    assert members == ["OrderService", "priceOf", "render", "place", "toString"]
    render = next(p for p in service.parts if p.name == "render")
    assert java[render.start :].lstrip().startswith("@Deprecated")


_COMMENT = re.compile(r"\s*(?://|/\*|\*|#\[|@)")


def _extent(lines: list[str], symbol: str, *, after: int = 1) -> tuple[int, int]:
    """1-based header and closing lines of ``symbol``'s definition, read from indentation alone: the first code
    line from ``after`` naming it, and the first line after it that starts with ``}`` at its indentation (the
    header itself when the definition is one line, or ends with ``;`` there)."""
    word = re.compile(rf"\b{re.escape(symbol)}\b")
    header = next(
        i for i in range(after, len(lines) + 1) if word.search(lines[i - 1]) and not _COMMENT.match(lines[i - 1])
    )
    text = lines[header - 1]
    indent = text[: len(text) - len(text.lstrip())]
    if text.count("{") == text.count("}") and not text.rstrip().endswith(("(", ",")):
        body_opens = header < len(lines) and lines[header].startswith(indent + "{")
        if not body_opens:
            return header, header
    closing = next(i for i in range(header + 1, len(lines) + 1) if re.match(rf"{indent}[}}]", lines[i - 1]))
    return header, closing


LICENCE = "".join(f"# Licence line {i}: the same in every file of the project.\n" for i in range(15))


def test_a_leading_licence_block_is_a_span_of_its_own(counter: TokenCounter) -> None:
    body = "import os\n\n\ndef handler_{i}(event):\n    return os.getenv(event) or {i}\n"
    files = [LICENCE + body.format(i=i) for i in range(3)]
    firsts = set()
    for text in files:
        spans = _spans(text, "python", counter, 512)
        assert_invariants(text, spans, counter, 512)
        firsts.add(text[spans[0].start : spans[0].end])
        assert spans[0].symbols.symbols == () and spans[1].symbols.primary_symbol is not None
    assert firsts == {LICENCE}  # identical text in every file: one embedding, one filter decision
    c_file = "/*\n * Copyright 2026 Example\n * Licensed under MIT\n */\n#include <stdio.h>\n"
    c_file += "int main(void) {\n  return 0;\n}\n"
    spans = _spans(c_file, "c", counter, 512)
    assert c_file[spans[0].start : spans[0].end].endswith(" */\n") and spans[1].symbols.primary_symbol == "main"
    short = "# one comment line\nimport os\n"
    assert len(_spans(short, "python", counter, 512)) == 1  # one or two comment lines are not a header
