"""Which of a result's definitions the query names, and that definition's own lines (jump to the definition).

A chunk of code can hold several definitions (a class and its methods, small functions packed together);
its stored ``symbol_lines`` say where each one is (:class:`shardfuse.pipeline.ingest.symbols.SymbolLines`).
When the query names one of them, the result's range is that definition's instead of the whole chunk's.

Which definition the query names, in this order (the first tier that finds one decides):

1. the query *is* a name (``apply_async``, ``Task.apply_async()``: :func:`shardfuse.query.symbol_boosts.bare_name`),
   and the chunk defines it: spelled the same, else the same ignoring case;
2. an identifier written in the query (``\\w+``, a dotted name's segments each) is, spelled the same, a name
   the chunk defines; then the same ignoring case;
3. a name whose identifier parts occur as a run of the query's, as the symbol boost matches them
   (:func:`shardfuse.query.symbol_boosts.symbol_matches`: ``parse_event`` for "how do we parse event data").

Within a tier the narrowest definition wins (``get`` rather than its class ``Cache`` for "Cache get"), then
the first in the chunk. A definition that goes on past the chunk's end ends on the chunk's last line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardfuse.pipeline.ingest.symbols import SymbolLines
from shardfuse.query.boosts import QueryTerms
from shardfuse.query.symbol_boosts import symbol_matches

_IDENTIFIER = re.compile(r"[^\W\d]\w*")


@dataclass(frozen=True, slots=True)
class SymbolRange:
    """A definition's name and its lines in the document (1-based, inclusive)."""

    name: str
    start_line: int
    end_line: int

    def to_json(self) -> dict[str, str | int]:
        return {"name": self.name, "start_line": self.start_line, "end_line": self.end_line}


def symbol_range(
    query_terms: QueryTerms, lines: Sequence[SymbolLines], *, start_line: int, end_line: int
) -> SymbolRange | None:
    """The lines of the definition in ``lines`` (a chunk's, relative to its ``start_line``) that the query
    names, within the chunk's ``start_line``–``end_line``; None when it names none of them."""
    named = named_definition(query_terms, lines)
    if named is None:
        return None
    first = min(start_line + named.first, end_line)
    return SymbolRange(named.name, first, min(max(start_line + named.last, first), end_line))


def named_definition(query_terms: QueryTerms, lines: Sequence[SymbolLines]) -> SymbolLines | None:
    """The definition of ``lines`` the query names (see the module docstring), or None."""
    if not lines:
        return None
    identifiers = set(_IDENTIFIER.findall(query_terms.query))
    folded = {word.casefold() for word in identifiers}
    tiers: list[Callable[[SymbolLines], bool]] = []
    if query_terms.name is not None:
        name = query_terms.name
        tiers += [lambda entry: entry.name == name, lambda entry: entry.name.casefold() == name.casefold()]
    tiers += [
        lambda entry: entry.name in identifiers,
        lambda entry: entry.name.casefold() in folded,
        lambda entry: symbol_matches(entry.name, query_terms.parts),
    ]
    for tier in tiers:
        found = [entry for entry in lines if tier(entry)]
        if found:
            return min(found, key=lambda entry: entry.last - entry.first)  # min keeps the first of equals
    return None
