"""Python's units, from its syntax tree (:mod:`ast`): see :mod:`.code_units`."""

from __future__ import annotations

import ast
import contextlib
import gc
import re
import warnings
from collections.abc import Iterator

from shardfuse.pipeline.ingest.chunkers.code_layout import Layout, SourceLines, Unit, fill

_PY_DEFINITION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# Python reads a lone "\r" as a line end; ast line numbers would not match lines counted by "\n".
_LONE_CR = re.compile(r"\r(?!\n)")


def python_layout(text: str) -> Layout:
    """The units of Python ``text``; one filler unit (``parsed=False``) if it does not parse."""
    try:
        # Invalid escapes and the like: the document's problem, not ours to log.
        with warnings.catch_warnings(), _collector_paused():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = None if _LONE_CR.search(text) else ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    if tree is None:
        return Layout((Unit(0, len(text)),), (), parsed=False)
    lines = SourceLines(text)
    units = _python_units(tree.body, lines, 0, len(text), 1)
    definitions = sorted(
        found for stmt in tree.body if isinstance(stmt, _PY_DEFINITION) for found in _python_names(stmt, lines)
    )
    return Layout(tuple(units), tuple(definitions))


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector around :func:`ast.parse`. The parser allocates a node per
    statement and expression; with the collector on, its full collections walk them again and again as they
    pile up, and a megabyte of short statements parses in 2.1 s instead of 0.8 s (superlinear: 0.16 s for
    128 KB). A fresh syntax tree holds no garbage cycles. Another thread pausing it too only defers its
    collections: it is switched back on by whoever found it on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _python_units(body: list[ast.stmt], lines: SourceLines, lo: int, hi: int, floor: int) -> list[Unit]:
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


def _python_names(node: ast.stmt, lines: SourceLines) -> Iterator[tuple[int, str]]:
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
