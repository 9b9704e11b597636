"""Each definition's own lines in its chunk (issue 22, item 5): what search's symbol ranges are made of."""

from __future__ import annotations

from textwrap import dedent

from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers import chunk_document
from shardfuse.pipeline.ingest.chunkers.base import ChunkBudget
from shardfuse.pipeline.ingest.symbols import ChunkSymbols, Role, SymbolLines, extract_symbols


def _lines(symbols: ChunkSymbols) -> list[tuple[str, int, int]]:
    return [(entry.name, entry.first, entry.last) for entry in symbols.lines]


PYTHON = dedent('''\
    import os

    @decorator
    def small(x):
        """Doc."""
        return x + 1

    class Cache:
        LIMIT = 1

        def get(self, key):
            return lookup(
                key,
            )
            # a comment after the body is not part of it

        async def put(self, key):
            pass
    # a comment at the top level
    MAX_SIZE = 3
    def opened():
        first = 1
        second = 2
''')


def test_python_definitions_span_header_to_last_statement() -> None:
    symbols = extract_symbols(PYTHON, language="python")
    assert _lines(symbols) == [
        ("small", 3, 5),  # the def line, not the decorator; to its return
        ("Cache", 7, 17),  # the class to its last method's last statement
        ("get", 10, 13),  # a multi-line call's closing line belongs to it; the trailing comment does not
        ("put", 16, 17),
        ("MAX_SIZE", 19, 19),
        ("opened", 20, 22),  # still open at the chunk's end: to the chunk's last line
    ]
    assert symbols.lines_of("get") == SymbolLines("get", 10, 13)


def test_python_chunk_starting_mid_line_counts_lines_from_its_first_fragment() -> None:
    text = "tail of a line)\n\ndef after():\n    return 1\n"
    assert _lines(extract_symbols(text, language="python", starts_mid_line=True)) == [("after", 2, 3)]


GO = dedent('''\
    package main

    // Add adds.
    func Add(a, b int) int {
    \treturn a + b
    }

    type Point struct {
    \tX int
    }

    const Limit = 10

    func (p Point) Norm() int {
    \tx := p.X
    \treturn x''')


def test_go_definitions_end_at_their_closing_brace_or_statement_end() -> None:
    symbols = extract_symbols(GO, language="go")
    assert _lines(symbols) == [("Add", 3, 5), ("Point", 7, 9), ("Limit", 11, 11), ("Norm", 13, 15)]


def test_javascript_methods_inside_their_class_and_a_multi_line_arrow() -> None:
    text = dedent('''\
        export class Cache {
          get(key) {
            return this.map["}"];
          }

          set(key, value) {
            this.map[key] = value;
          }
        }
        const add = (a, b) =>
          a + b;
    ''')
    assert _lines(extract_symbols(text, language="javascript")) == [
        ("Cache", 0, 8), ("get", 1, 3), ("set", 5, 7), ("add", 9, 10)]


def test_lines_are_stored_with_the_symbols_and_old_rows_read_without_them() -> None:
    symbols = extract_symbols(PYTHON, language="python")
    stored = symbols.to_json()
    assert stored is not None and stored["lines"][0] == ["small", 3, 5]
    assert ChunkSymbols.from_json(stored).lines == symbols.lines
    # A row written before lines existed, and entries of the wrong shape, read as "no range".
    old = {"symbols": ["small"], "primary": "small", "role": "complete"}
    assert ChunkSymbols.from_json(old).lines == ()
    odd = {**old, "lines": [["small", 3, 5], ["bad", -1, 2], ["bad", 4, 2], [1, 2, 3], ["x", 1], "y", ["z", 1.5, 2]]}
    assert ChunkSymbols.from_json(odd).lines == (SymbolLines("small", 3, 5),)
    assert ChunkSymbols.from_json({**old, "lines": "nonsense"}).lines == ()


def test_chunks_travel_with_their_lines() -> None:
    symbols = ChunkSymbols(("f",), "f", Role.COMPLETE, (SymbolLines("f", 0, 2),))
    chunk = Chunk(ordinal=0, text="def f():\n    pass\n", start_char=0, end_char=18, start_line=1, end_line=2,
                  token_count=5, symbols=symbols)
    assert Chunk.from_dict(chunk.to_dict()).symbols.lines == (SymbolLines("f", 0, 2),)


def test_the_code_chunker_s_chunks_carry_lines_for_their_definitions() -> None:
    """The code strategy names definitions from its own reading (ast for Python); the lines come with them."""
    functions = "".join(f"def function_{i}(x):\n    y = x * {i}\n    return y\n\n\n" for i in range(40))
    chunks = chunk_document(functions, path="src/many.py", counter=TokenCounter(),
                            budget=ChunkBudget(max_tokens=64, overlap_tokens=0), strategies={"code": "code"})
    assert len(chunks) > 1
    document_lines = functions.split("\n")
    for chunk in chunks:
        assert chunk.symbols.symbols, chunk.text
        assert [entry.name for entry in chunk.symbols.lines] == list(chunk.symbols.symbols)
        for entry in chunk.symbols.lines:
            # The range's first line is the definition's header, its last its return, in the document.
            assert document_lines[chunk.start_line - 1 + entry.first] == f"def {entry.name}(x):"
            assert document_lines[chunk.start_line - 1 + entry.last].strip() == "return y"
