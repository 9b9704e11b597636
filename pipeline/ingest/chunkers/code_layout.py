"""What a code layout is made of (:class:`Unit`, :class:`Layout`), and what the Python and brace-language
readers (:mod:`.python_units`, :mod:`.brace_units`) share: line offsets, and filler units between definitions.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace


# Not frozen, for speed (never mutated): see markup_blocks.Block.
@dataclass(slots=True)
class Unit:
    """A line-aligned range of the text: one definition (``name``) or code between definitions.

    ``code`` is False for a filler holding only comments and blank lines. ``parts`` cuts a definition at
    the definitions directly inside it (same rules), covering ``[start, end)`` in order; empty when it has
    none.
    """

    start: int
    end: int
    name: str | None = None
    code: bool = True
    parts: tuple[Unit, ...] = ()


@dataclass(frozen=True, slots=True)
class Layout:
    """A document's units (covering it in order) and every definition inside them as ``(offset, name)``."""

    units: tuple[Unit, ...]
    definitions: tuple[tuple[int, str], ...]
    parsed: bool = True  # False: Python that does not parse, one filler unit


class SourceLines:
    """Line starts of a text, by ``"\\n"`` only; lines are numbered from 1 as in :mod:`ast`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0, *(m.end() for m in re.finditer("\n", text))]
        if self.starts[-1] == len(text) and len(self.starts) > 1:
            self.starts.pop()  # no line after a final "\n"

    def start(self, line: int) -> int:
        return self.starts[line - 1]

    def end(self, line: int) -> int:
        """The offset after line ``line``'s "\\n" (or the end of the text)."""
        return self.starts[line] if line < len(self.starts) else len(self.text)

    def line_of(self, offset: int) -> int:
        return bisect_right(self.starts, offset)

    def content(self, line: int) -> str:
        return self.text[self.start(line) : self.end(line)]

    def attach_above(self, line: int, floor: int, attachable: Callable[[int], bool]) -> int:
        """The first line of the run of attachable lines directly above ``line``, not above ``floor``."""
        while line > floor and attachable(line - 1):
            line -= 1
        return line


def fill(text: str, lo: int, hi: int, definitions: Sequence[Unit], is_code: Callable[[int, int], bool]) -> list[Unit]:
    """``definitions`` (in order, inside ``[lo, hi)``) with filler units between them, covering ``[lo, hi)``.

    Whitespace-only filler joins the unit before it (the first unit when nothing precedes it), so that no
    unit is blank and a definition's trailing blank lines stay with it.
    """
    units: list[Unit] = []
    cursor = lo
    for unit in (*definitions, None):
        gap_end = hi if unit is None else unit.start
        if gap_end > cursor:
            units.append(Unit(cursor, gap_end, code=is_code(cursor, gap_end)))
            if text[cursor:gap_end].isspace():
                units.pop()
                if units:
                    units[-1] = _widen(units[-1], end=gap_end)
                elif unit is not None:
                    unit = _widen(unit, start=cursor)
        if unit is not None:
            units.append(unit)
            cursor = unit.end
    if not units:
        return [Unit(lo, hi, code=False)]
    return units


def _widen(unit: Unit, *, start: int | None = None, end: int | None = None) -> Unit:
    parts = list(unit.parts)
    if parts and start is not None:
        parts[0] = _widen(parts[0], start=start)
    if parts and end is not None:
        parts[-1] = _widen(parts[-1], end=end)
    return replace(unit, start=unit.start if start is None else start, end=unit.end if end is None else end,
                   parts=tuple(parts))  # fmt: skip
