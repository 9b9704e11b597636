"""The ends of brace-language header patterns that may run over many lines, matched in amortised O(1).

A C++ function header ends at its body's ``{``, possibly lines after its parameters (``void f()\\n{``, a
constructor's initializer list); a Java method at ``{``, ``;`` or ``=>``; a C++ class is a definition only
if a ``{`` follows its base list. As regular expressions, ``(?:[^(){};=]|\\([^(){};]*\\))*?\\{`` and
``(?=\\s*+(?:final\\s*+)?(?::[^;{}]*)?\\{)``, these scan from every candidate line to the next bracket, so
a file of ``int f()`` lines without a body (or ``struct A :`` lines) costs O(n²): half a minute for 128 KB.

Here the header's pattern stops after its name or parameters, and the rest is decided from the positions
of the text's brackets, semicolons and ``=`` (found once per text); each bracket's answer is remembered,
so every candidate after the first reuses it. The answers are those of the regular expressions.
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate

_SPECIAL = re.compile(r"[(){};=]")
_SPECIAL_SPLIT = re.compile(f"({_SPECIAL.pattern})")
_BASE_SPECIAL = re.compile(r"[;{}]")
_BEFORE_BASES = re.compile(r"\s*+(?:final\s*+)?")


class Tail(enum.Enum):
    """What must follow a header pattern's match for the header to count."""

    BODY = "body"  # C++ functions: parentheses groups and other code, then "{" (consumed)
    BODY_OR_DECLARATION = "body_or_declaration"  # Java/C# methods: ... then "{", ";" or "=>" (consumed)
    BASES_THEN_BODY = "bases_then_body"  # C++ types: optional `final`, an optional `: bases`, then "{" (lookahead)


class TailScan:
    """The tails of one text (the blanked code a brace language's headers are matched in)."""

    def __init__(self, code: str) -> None:
        self._code = code
        self._specials: list[int] | None = None
        self._base_specials: list[int] | None = None
        # Per tail kind, each bracket's answer (keyed by the bracket's offset alone: one lookup a candidate).
        self._memo: dict[Tail, dict[int, int | None]] = {Tail.BODY: {}, Tail.BODY_OR_DECLARATION: {}}
        self._last: dict[Tail, int] = {}  # per tail kind, the offset of the last character that can end one

    def ender(self, tail: Tail) -> Callable[[int], int | None]:
        """For ``tail``: where a match whose pattern part ended at ``at`` ends with it, or None if it has none,
        as a function of ``at``. A header is tried at every line of a file: a bracket already answered is
        looked up without a further call."""
        if tail is Tail.BASES_THEN_BODY:
            return lambda at: at if self._bases_then_body(at) else None
        declaration = tail is Tail.BODY_OR_DECLARATION
        specials = self._all_specials()
        memo = self._memo[tail]

        def end(at: int) -> int | None:
            if self.none_after(tail, at):  # no walk over every bracket left when none can end the tail
                return None
            i = bisect_left(specials, at)
            if i < len(specials) and specials[i] in memo:
                return memo[specials[i]]
            return self._body(at, declaration=declaration)

        return end

    def none_after(self, tail: Tail, at: int) -> bool:
        """Whether no match of ``tail`` can start at ``at`` or after it: each tail ends at a ``{`` (or, for a
        declaration, a ``;`` or ``=>``), and none is left from there. A header then need not be tried at every
        later line (a C or C++ header file of prototypes holds no ``{`` at all)."""
        last = self._last.get(tail)
        if last is None:
            code = self._code
            ends = ("{", ";", "=>") if tail is Tail.BODY_OR_DECLARATION else ("{",)
            last = self._last[tail] = max(code.rfind(end) for end in ends)
        return last < at

    def _body(self, at: int, *, declaration: bool) -> int | None:
        """``(?:[^(){};=]|\\([^(){};]*\\))*?(?:\\{|;|=>)`` (without ``;`` and ``=>`` unless ``declaration``)
        from ``at``: code up to the first bracket decides; a parenthesised group (no brackets or ``;``
        inside) is stepped over."""
        code = self._code
        specials = self._all_specials()
        memo = self._memo[Tail.BODY_OR_DECLARATION if declaration else Tail.BODY]
        i = bisect_left(specials, at)
        visited: list[int] = []
        end: int | None = None
        while i < len(specials):
            s = specials[i]
            if s in memo:
                end = memo[s]
                break
            visited.append(s)
            c = code[s]
            if c == "{" or (declaration and c == ";"):
                end = s + 1
            elif c == "=" and declaration and code.startswith("=>", s):
                end = s + 2
            elif c == "(":
                j = i + 1
                while j < len(specials) and code[specials[j]] == "=":  # "=" may sit inside a group
                    j += 1
                if j < len(specials) and code[specials[j]] == ")":
                    i = j + 1
                    continue
            break  # any other bracket, ";" or "=" ends the search without a body
        for s in visited:
            memo[s] = end
        return end

    def _bases_then_body(self, at: int) -> bool:
        """``(?=\\s*+(?:final\\s*+)?(?::[^;{}]*)?\\{)`` at ``at``."""
        code = self._code
        p = _BEFORE_BASES.match(code, at)
        pos = at if p is None else p.end()
        if code.startswith("{", pos):
            return True
        if not code.startswith(":", pos):
            return False
        if self._base_specials is None:
            self._base_specials = [m.start() for m in _BASE_SPECIAL.finditer(code)]
        i = bisect_left(self._base_specials, pos + 1)
        return i < len(self._base_specials) and code[self._base_specials[i]] == "{"

    def _all_specials(self) -> list[int]:
        if self._specials is None:
            # The offsets from the pieces' lengths, as BraceTokens.scan does: no match object a bracket.
            pieces = _SPECIAL_SPLIT.split(self._code)
            self._specials = list(accumulate(map(len, pieces), initial=0))[1:-1:2]
        return self._specials
