"""A grep pattern: a literal or an RE2 regular expression, case-sensitive or not, checked and compiled once per
query; the grams the index narrows by; and the verification of a candidate block's lines.

The regex dialect is RE2 (``google-re2``): matching takes time linear in the text, and there are no
backreferences or look-around, so no pattern can hang a query worker. Matching is per line (lines end at
``"\\n"``, as the chunkers count them): a pattern never matches across a line break.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import re2

from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.query.grep.regex_grams import ANYTHING, Clauses, literal_grams, required_grams

# \A or \z in a pattern (after an even number of backslashes): anchors to the whole text.
_TEXT_ANCHOR = re.compile(r"(?<!\\)(?:\\\\)*\\[Az]")

# RE2's program for one pattern is bounded by this much memory (the library's default is 8 MiB): a pattern
# past it, such as a large counted repetition of a class, is refused instead of compiled.
MAX_REGEX_MEMORY = 8 << 20


@dataclass(frozen=True, slots=True)
class LineMatch:
    """One line of a block that matches: its offset in the block (0-based), its text, and where (in
    characters) its first match starts."""

    offset: int
    text: str
    column: int


class GrepPattern:
    """What a grep request searches for (its ``query``, read as a literal unless ``regex``)."""

    def __init__(self, text: str, *, regex: bool, case_sensitive: bool) -> None:
        if not regex and "\n" in text:
            raise InvalidQueryError("grep matches within one line: the literal holds a line break; search for one "
                                    "of its lines")
        self.text = text
        self.regex = regex
        self.case_sensitive = case_sensitive
        options = re2.Options()
        options.case_sensitive = case_sensitive
        options.literal = not regex
        options.max_mem = MAX_REGEX_MEMORY
        options.log_errors = False
        try:
            self._compiled: Any = re2.compile(text, options)
            # The block-wide search, with ^ and $ at every line's ends; \A and \z (the line's ends, searching
            # one line) have no such form: a pattern with them is searched line by line.
            self._scan: Any = (self._compiled if not regex else
                               None if _TEXT_ANCHOR.search(text) else re2.compile("(?m)" + text, options))
        except re2.error as exc:
            reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise InvalidQueryError(f"query is not a regular expression RE2 accepts ({reason}); RE2 has no "
                                    "backreferences or look-around, and \\Z is written \\z") from exc
        self._needle = text.encode("utf-8") if case_sensitive and not regex else None
        self.clauses: Clauses = (required_grams(text, case_sensitive=case_sensitive) if regex
                                 else literal_grams(text, case_sensitive=case_sensitive))

    @property
    def indexed(self) -> bool:
        """Whether the index can narrow the search (some gram is certain to be in every matching line)."""
        return self.clauses != ANYTHING

    def describe(self) -> str:
        kind = "regular expression" if self.regex else "literal"
        case = "case-sensitive" if self.case_sensitive else "case-insensitive"
        return f"{case} {kind} {self.text!r}"

    def matching_lines(self, block: str) -> Iterator[LineMatch]:
        """The lines of ``block`` (whole lines joined by ``"\\n"``) that hold a match, in order.

        One search over the whole block finds the next line that may match; only that line is then searched
        on its own (a match the block search found may span a line break, which the line's own search
        rejects), and the block search goes on from the next line.
        """
        data = block.encode("utf-8")
        pos, counted, offset = 0, 0, 0
        while pos <= len(data):
            found = self._find(data, pos)
            if found < 0:
                return
            start = data.rfind(b"\n", 0, found) + 1
            end = data.find(b"\n", found)
            end = len(data) if end < 0 else end
            offset += data.count(b"\n", counted, start)
            counted = start
            line = data[start:end]
            column = self._column(line)
            if column >= 0:
                yield LineMatch(offset=offset, text=line.decode("utf-8"), column=len(line[:column].decode("utf-8")))
            pos = end + 1

    def _column(self, line: bytes) -> int:
        """Where the first match in ``line`` starts (in bytes), -1 when it has none."""
        if self._needle is not None:
            return line.find(self._needle)
        match = self._compiled.search(line)
        return -1 if match is None else int(match.start())

    def _find(self, data: bytes, pos: int) -> int:
        """Where the next possible match at or after ``pos`` starts (-1: none); line by line for a pattern the
        block-wide search cannot take, where each line start is a possible match."""
        if self._needle is not None:
            return data.find(self._needle, pos)
        if self._scan is None:
            return pos
        match = self._scan.search(data, pos)
        return -1 if match is None else int(match.start())
