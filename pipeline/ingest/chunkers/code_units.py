"""Where source code's top-level definitions are: the units the code chunker packs into spans.

:func:`layout` cuts a document into :class:`Unit` s that cover it in order, line-aligned: each definition
(with the comment, doc-comment, decorator, attribute and annotation lines directly above it) is one unit,
and the code between definitions is grouped into filler units. A definition whose body holds definitions
of its own (a class's methods, an ``impl`` block's functions) carries ``parts``: its range cut the same
way one level down, so that a definition too large for one chunk can be split at its members.

- **Python** is parsed with :mod:`ast`: definitions are ``def``/``async def``/``class``; constants, type
  aliases and definitions inside top-level statements (``if TYPE_CHECKING:``) are filler. A file that does
  not parse gets one filler unit and ``parsed=False``.
- **Brace languages** reuse :mod:`shardfuse.pipeline.ingest.symbols` (strings and comments blanked, header
  patterns, brace matching): definitions are function and type headers (not constants) at brace depth 0,
  where the braces of ``namespace``/``mod``/``module``/``extern "C"`` blocks do not count; a definition ends
  where :mod:`shardfuse.pipeline.ingest.symbols` ends it (its closing brace, or the ``;`` or line end of a
  statement).

Python is read by :mod:`.python_units`, brace languages by :mod:`.brace_units`; both build on
:mod:`.code_layout` (the unit types, line offsets, filler between definitions).

``definitions`` lists ``(offset, name)`` of every definition inside a definition unit, nested ones
included, in order: filler defines nothing.
"""

from __future__ import annotations

from shardfuse.pipeline.ingest.chunkers.brace_units import BRACE_LANGUAGES, brace_layout
from shardfuse.pipeline.ingest.chunkers.code_layout import Layout, Unit
from shardfuse.pipeline.ingest.chunkers.python_units import python_layout
from shardfuse.pipeline.ingest.symbols import Language

__all__ = ["LANGUAGES", "Layout", "Unit", "layout", "require_language"]

LANGUAGES: frozenset[str] = frozenset({Language.PYTHON, *BRACE_LANGUAGES})


def require_language(language: str) -> None:
    """ValueError unless :func:`layout` reads ``language``."""
    if language not in LANGUAGES:
        raise ValueError(f"no code chunking for language {language!r}; known: {', '.join(sorted(LANGUAGES))}")


def layout(text: str, language: str) -> Layout:
    """The units of ``text`` (non-empty) in ``language``; ValueError for a language this module cannot read."""
    require_language(language)
    if language == Language.PYTHON:
        return python_layout(text)
    return brace_layout(text, language)
