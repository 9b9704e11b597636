"""Hostile documents for the chunkers: text built to make a careless parser quadratic (or crash it), one
family per trap, each ``(path, text of about n characters)``. Shared by the linearity test
(tests/unit/pipeline/ingest/test_hostile_chunking.py) and the benchmark (tests/benchmarks/bench_hostile_chunking.py).

Every family was measured against the chunkers before they were made linear (docs/performance.md): the
``<h2 `` family took 10 s at 200 KB, ``int f()`` lines without a body half a minute at 128 KB, and nested
brace functions crashed with RecursionError.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers import ChunkBudget, chunk_document

# The strategies of the default settings (config/default.toml).
STRATEGIES: Mapping[str, str] = {".md": "semantic", ".html": "semantic", ".rst": "semantic", ".txt": "semantic",
                                 "code": "code", "*": "overlapping"}
BUDGET = ChunkBudget(max_tokens=512, overlap_tokens=64)


def repeated(unit: str) -> Callable[[int], str]:
    return lambda n: (unit * (n // len(unit) + 1))[:n]


def _nested_python(n: int) -> str:
    lines, total, depth = [], 0, 0
    while total < n:
        lines.append(" " * depth + "def f():\n")
        total += len(lines[-1])
        depth = (depth + 1) % 90  # Python's parser refuses 100 levels: nest as deep as it reads, again and again
    return "".join(lines)[:n]


def _atx_whitespace(n: int) -> str:
    # One heading whose text is a huge run of blanks: the closing-sequence regex rescanned it per position.
    return ("# a" + " \t" * n)[: n - 1] + "b"


# One line of a million identical characters is one "word" to tiktoken, whose BPE is superlinear in a word's
# length (0.05 s for 256 KB, 0.4 s for 1 MB, 2.3 s for 4 MB of "#"): outside the chunkers, so these families
# are reported by the benchmark but not held to its goal.
SINGLE_RUNS: dict[str, tuple[str, str, Callable[[int], str]]] = {
    "markdown one # line": ("semantic", "notes.md", repeated("#")),
    "html one < line": ("semantic", "page.html", repeated("<")),
    "windows one x line": ("windows", "data.dat", repeated("x")),
}

# family -> (chunker it reaches, file name, text builder)
FAMILIES: dict[str, tuple[str, str, Callable[[int], str]]] = {
    # HTML (semantic): open tags without ">", unclosed headings and raw-text elements, attributes left open.
    "html <h2 repeated": ("semantic", "page.html", repeated("<h2 ")),
    "html <h2 lines": ("semantic", "page.html", repeated("<h2 \n")),
    "html unclosed <h2>": ("semantic", "page.html", repeated("<h2>x")),
    "html <pre without >": ("semantic", "page.html", repeated("<pre ")),
    "html unclosed <title>": ("semantic", "page.html", repeated("<title>")),
    "html open attribute": ("semantic", "page.html", repeated("<h1 a=b ")),
    "html unclosed comment": ("semantic", "page.html", repeated("<!--")),
    # Markdown (semantic): heading runs, fences, front matter, setext, blanks in a heading.
    "markdown # runs": ("semantic", "notes.md", repeated("#" * 9999 + "\n")),
    "markdown # lines": ("semantic", "notes.md", repeated("#\n")),
    "markdown blanks in a heading": ("semantic", "notes.md", _atx_whitespace),
    "markdown open fences": ("semantic", "notes.md", repeated("```\n")),
    "markdown setext": ("semantic", "notes.md", repeated("a\n=\n")),
    "rst adornments": ("semantic", "notes.rst", repeated("a\n==\n")),
    "text lone CRs": ("semantic", "notes.txt", repeated("\rx\n")),
    # Code (definitions): deep nesting, headers without bodies, long lines, open literals.
    "python nested defs": ("code", "deep.py", _nested_python),
    "python parentheses": ("code", "deep.py", repeated("(")),
    "python one long line": ("code", "long.py", repeated("x=1;")),
    "c nested functions": ("code", "deep.c", repeated("int f(){\n")),
    "c headers without bodies": ("code", "decl.c", repeated("int f()\n")),
    "c nested braces": ("code", "deep.c", repeated("{\n")),
    "c++ classes without bodies": ("code", "decl.cpp", repeated("struct A :\n")),
    "java methods without bodies": ("code", "Decl.java", repeated("void f()\n")),
    "java lower-case word lines": ("code", "Words.java", repeated("a\n")),
    "javascript nested methods": ("code", "deep.js", repeated(" f(){\n")),
    "rust impl lines": ("code", "decl.rs", repeated("impl a\n")),
    "c open raw strings": ("code", "raw.cpp", repeated('R"(')),
    "python open strings": ("code", "open.py", repeated('"""')),
    # Token windows (any other file): runs of one character, and very many short lines.
    "windows runs of one character": ("windows", "data.dat", repeated("x" * 9999 + "\n")),
    "windows short lines": ("windows", "data.log", repeated("x\n")),
}


# Families whose cost is their sheer number of elements (a heading, block, definition or statement every
# two to nine characters, a hundred thousand or more per megabyte): linear, but as many Python steps.
VOLUME = frozenset({"html <h2 lines", "markdown # lines", "markdown setext", "rst adornments", "text lone CRs",
                    "c nested braces", "windows short lines", "java lower-case word lines", "c nested functions",
                    "javascript nested methods", "python one long line", "rust impl lines"})


def chunk_seconds(family: str, n: int, *, counter: TokenCounter,
                  clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds to chunk ``n`` characters of ``family`` with the default strategies, by ``clock`` (wall time
    by default; the unit tests' ratios use this thread's CPU time, which other processes' load leaves alone)."""
    _, path, build = FAMILIES[family] if family in FAMILIES else SINGLE_RUNS[family]
    text = build(n)
    began = clock()
    chunk_document(text, path=path, counter=counter, budget=BUDGET, strategies=STRATEGIES)
    return clock() - began
