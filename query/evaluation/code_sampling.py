"""The queries of a code-search evaluation, drawn from Python source with :mod:`ast`, as pure functions.

Every function, method and class of a tree (nested ones too) is a :class:`CodeDefinition`. Only names the
tree defines **exactly once** are asked for, so that each query has one right answer, and no dunders
(``__init__`` is everywhere). Two kinds of query come from them (:func:`sample_cases`):

- ``name``: the bare name (``apply_async``), to be found at rank 1;
- ``docstring``: the first sentence of a function's or method's docstring with the name removed
  (:func:`strip_name`), to be found in the top 5. A sentence that more than one definition opens its
  docstring with is left out (it names neither), and so is one with fewer than ``MIN_DOC_WORDS`` words left.

The sample is a seeded :class:`random.Random` draw from the candidates sorted by path and line, so the same
tree and seed always ask the same questions.
"""

from __future__ import annotations

import ast
import random
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from shardfuse.pipeline.index.lexical.tokenizer import split_identifier

MIN_DOC_WORDS = 3
_DEFINITION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# A sentence ends at ". ", "! " or "? " (or a blank line, or the text's end); "e.g. x" is not an end.
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)[.!?](?=\s|$)|\n\s*\n")
_WORD = re.compile(r"\w+")
# Sphinx / RST markup around a name: :class:`~celery.Task`, ``name``, `name`.
_ROLE = re.compile(r":[\w:]+:`~?([^`]*)`")
_BACKTICKS = re.compile(r"`+([^`]*)`+")


@dataclass(frozen=True, slots=True)
class CodeDefinition:
    """One ``def`` or ``class`` of a source file."""

    path: str  # the document path it is published under
    name: str
    qualified: str  # "Outer.name" for methods and nested definitions
    kind: str  # "function", "method" or "class"
    line: int  # 1-based line of the ``def``/``class`` keyword (after any decorators)
    end_line: int
    summary: str  # the docstring's first sentence, whitespace folded ("" when it has none)


@dataclass(frozen=True, slots=True)
class CodeCase:
    """One query and the definition it should find."""

    kind: str  # "name" or "docstring"
    query: str
    target: CodeDefinition


def find_definitions(path: str, source: str) -> list[CodeDefinition]:
    """Every definition in ``source`` (published as ``path``), in source order; none when it does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like are the file's business
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = list(_walk(tree.body, path, prefix="", in_class=False))
    return sorted(found, key=lambda d: d.line)


def unique_definitions(definitions: Iterable[CodeDefinition]) -> list[CodeDefinition]:
    """The definitions whose name no other definition in ``definitions`` shares, dunders left out; sorted by
    path and line."""
    listed = list(definitions)
    counts = Counter(d.name for d in listed)
    return sorted(
        (d for d in listed if counts[d.name] == 1 and not _is_dunder(d.name)), key=lambda d: (d.path, d.line)
    )


def sample_cases(
    definitions: Iterable[CodeDefinition], *, n: int, seed: int, strip_parts: bool = False
) -> list[CodeCase]:
    """Up to ``n`` name cases and ``n`` docstring cases from the tree's ``definitions`` (all of them, not only
    the unique ones: uniqueness is judged here). ``strip_parts`` also removes the name's identifier parts
    from docstring queries (see :func:`strip_name`). See the module docstring."""
    unique = unique_definitions(definitions)
    summaries = Counter(d.summary.casefold() for d in unique if d.summary)
    documented: list[CodeCase] = []
    for definition in unique:
        if definition.kind == "class" or summaries[definition.summary.casefold()] != 1:
            continue
        query = strip_name(definition.summary, definition.name, parts=strip_parts)
        if len(_WORD.findall(query)) >= MIN_DOC_WORDS:
            documented.append(CodeCase("docstring", query, definition))
    names = [CodeCase("name", d.name, d) for d in unique]
    return _draw(names, n, seed) + _draw(documented, n, seed)


def first_sentence(docstring: str) -> str:
    """The docstring's first sentence (up to ``.``, ``!`` or ``?`` before a space, or a blank line), with its
    whitespace folded and its terminator kept."""
    text = docstring.strip()
    match = _SENTENCE_END.search(text)
    if match is None:
        sentence = text
    elif match.group().strip():  # ".", "!" or "?": kept
        sentence = text[: match.end()]
    else:  # a blank line
        sentence = text[: match.start()]
    return " ".join(sentence.split())


def strip_name(sentence: str, name: str, *, parts: bool = False) -> str:
    """``sentence`` without ``name``: as a whole word, dotted (``Task.name``), called (``name()``) or in RST
    markup; with ``parts``, also without each word of the name's identifier parts (``apply_async`` → "apply",
    "async"). Whitespace is folded; case does not matter."""
    text = _ROLE.sub(lambda m: m.group(1), sentence)
    text = _BACKTICKS.sub(lambda m: m.group(1), text)
    words = [name, *(split_identifier(name) if parts else ())]
    for word in sorted({w.casefold() for w in words if w}, key=len, reverse=True):
        # The word with any dotted qualifier before it and a call after it; \w boundaries keep "task" in "tasks".
        pattern = r"(?<![\w.])(?:[\w]+\.)*" + re.escape(word) + r"(?:\(\))?(?!\w)"
        text = re.sub(pattern, " ", text, flags=re.IGNORECASE)
    return " ".join(text.split())


def _walk(body: list[ast.stmt], path: str, *, prefix: str, in_class: bool) -> Iterator[CodeDefinition]:
    """Definitions in ``body`` and below it, through any statement (a ``def`` under ``if`` counts)."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, _DEFINITION):
            kind = "class" if isinstance(node, ast.ClassDef) else "method" if in_class else "function"
            docstring = ast.get_docstring(node, clean=True) or ""
            yield CodeDefinition(
                path=path, name=node.name, qualified=prefix + node.name, kind=kind, line=node.lineno,
                end_line=node.end_lineno or node.lineno, summary=first_sentence(docstring),
            )
            yield from _walk(node.body, path, prefix=f"{prefix}{node.name}.",
                             in_class=isinstance(node, ast.ClassDef))
        elif isinstance(node, ast.stmt | ast.excepthandler | ast.match_case):
            stack.extend(reversed([c for c in ast.iter_child_nodes(node)
                                   if isinstance(c, ast.stmt | ast.excepthandler | ast.match_case)]))


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _draw(cases: list[CodeCase], n: int, seed: int) -> list[CodeCase]:
    if len(cases) <= n:
        return cases
    chosen = random.Random(seed).sample(range(len(cases)), n)
    return [cases[i] for i in sorted(chosen)]
