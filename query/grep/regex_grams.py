"""The trigrams every match of an RE2 pattern must contain, as an OR of ANDs (Russ Cox's "Regular Expression
Matching with a Trigram Index", simplified): literal runs in concatenations, alternations as ORs.

The pattern has already compiled under RE2 (:mod:`shardfuse.query.grep.pattern`): this parser only has to
find the structure of a valid pattern. Everything it does not take for a literal (classes of more than a
few characters, ``.``, ``\\w``, Unicode classes, octal escapes) counts as "any string", which can only make
the requirement weaker, never wrong. Literals are normalised as the index normalises text
(:func:`shardfuse.pipeline.index.store.grep_blocks.normalized`); under case-insensitive matching (the flag, or
``(?i)`` anywhere in the pattern) a non-ASCII letter counts as "any", because its other case has other bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import product

from shardfuse.pipeline.index.store.grep_blocks import grams_of, normalized

# DNF: each clause a set of grams that must all be present; the empty clause is "anything matches".
Clauses = frozenset[frozenset[int]]
ANYTHING: Clauses = frozenset({frozenset()})
MAX_EXACT = 16  # strings an exact set may hold before it is turned into a requirement
MAX_CLAUSES = 8  # OR-ed clauses before a requirement is dropped (weaker, still true)
# Grams kept per clause. The GIN index reads every gram's posting list, and a common gram's (" th", "ion",
# "_id") is long: a 30-character literal's 28 grams cost several times what its 6 rarest-looking ones do, and
# narrow hardly further (measured, tests/benchmarks/bench_grep.py). Any subset is still required.
MAX_GRAMS = 6
# Bytes that are common in text and code: a gram made of them is likely in many blocks, kept last.
_COMMON = frozenset(b" etaoinsrhldcu_.,()=:'\"\t")

_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")
_SIMPLE_ESCAPES = {"a": "\a", "f": "\f", "t": "\t", "n": "\n", "r": "\r", "v": "\v"}
_HEX = re.compile(r"x(\{[0-9A-Fa-f]+\}|[0-9A-Fa-f]{2})")


@dataclass(frozen=True, slots=True)
class _Info:
    # The node matches exactly one of these normalised strings; None: not known (or too many).
    exact: frozenset[bytes] | None
    # What every match of the node must contain besides.
    clauses: Clauses = ANYTHING


_UNKNOWN = _Info(None)
_EMPTY = _Info(frozenset({b""}))
# A bare flag group, and one with a repetition after it: RE2 repeats the node before (``a(?i)*`` is ``a*``).
_FLAGS = _Info(frozenset({b""}))
_REPEATED_BEFORE = _Info(frozenset({b""}))


def required_grams(pattern: str, *, case_sensitive: bool) -> Clauses:
    """The OR of ANDs of grams every match of ``pattern`` (valid RE2) contains; :data:`ANYTHING` when no gram
    is certain (a pattern such as ``\\w+`` or ``ab``)."""
    fold = not case_sensitive or "(?" in pattern and re.search(r"\(\?[a-zA-Z]*i", pattern) is not None
    parser = _Parser(pattern, fold=fold)
    info = parser.alternation()
    return _and(info.clauses, _as_clauses(info.exact))


def literal_grams(text: str, *, case_sensitive: bool) -> Clauses:
    """The grams every line holding the literal ``text`` contains (case-insensitively, only the grams of its
    runs without cased non-ASCII letters: their other case has other bytes)."""
    if case_sensitive:
        return _as_clauses(frozenset({normalized(text)}))
    runs = re.split(r"[^\x00-\x7f](?<=[^\W\d_])", text)
    cased = [run for run in runs if len(run.encode("utf-8")) >= 3]
    return _and_all(_as_clauses(frozenset({normalized(run)})) for run in cased)


def _as_clauses(exact: frozenset[bytes] | None) -> Clauses:
    """An exact set as a requirement: one of its strings, each with all its grams."""
    if exact is None:
        return ANYTHING
    clauses = {_rarest(grams_of(s).tolist()) for s in exact}
    return ANYTHING if frozenset() in clauses or len(clauses) > MAX_CLAUSES else frozenset(clauses)


def _and(a: Clauses, b: Clauses) -> Clauses:
    if a == ANYTHING:
        return b
    if b == ANYTHING:
        return a
    both = frozenset(x | y for x, y in product(a, b))
    if len(both) <= MAX_CLAUSES:
        return frozenset(_rarest(c) for c in both)
    # Either side alone is still required: keep the one that narrows more.
    return min(a, b, key=lambda c: (len(c), -min(len(x) for x in c)))


def _rarest(grams: Iterable[int]) -> frozenset[int]:
    """At most :data:`MAX_GRAMS` of ``grams``, those with the fewest common bytes first."""
    ranked = sorted(grams, key=lambda g: (sum((b in _COMMON) for b in (g >> 16, (g >> 8) & 255, g & 255)), g))
    return frozenset(ranked[:MAX_GRAMS])


def _and_all(parts: Iterable[Clauses]) -> Clauses:
    result = ANYTHING
    for part in parts:
        result = _and(result, part)
    return result


def _or(parts: Sequence[Clauses]) -> Clauses:
    union = frozenset(c for part in parts for c in part)
    return ANYTHING if frozenset() in union or len(union) > MAX_CLAUSES else union


class _Parser:
    """Recursive descent over a valid RE2 pattern, one node's :class:`_Info` per call."""

    def __init__(self, pattern: str, *, fold: bool) -> None:
        self.p = pattern
        self.i = 0
        self.fold = fold

    def _peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def alternation(self) -> _Info:
        branches = [self._concat()]
        while self._peek() == "|":
            self.i += 1
            branches.append(self._concat())
        if len(branches) == 1:
            return branches[0]
        if all(b.exact is not None and b.clauses == ANYTHING for b in branches):
            union = frozenset(s for b in branches for s in b.exact or ())
            if len(union) <= MAX_EXACT:
                return _Info(union)
        return _Info(None, _or([_and(b.clauses, _as_clauses(b.exact)) for b in branches]))

    def _concat(self) -> _Info:
        done: Clauses = ANYTHING
        run: frozenset[bytes] = frozenset({b""})
        whole = True  # every part so far exact, and the run never spilled
        while self.i < len(self.p) and self._peek() not in "|)":
            part = self._repeat()
            if part is _REPEATED_BEFORE:  # what came before may repeat or vanish: it requires nothing for sure
                done, run, whole = ANYTHING, frozenset({b""}), False
                continue
            done = _and(done, part.clauses)
            if part.exact is None:
                done, run, whole = _and(done, _as_clauses(run)), frozenset({b""}), False
            elif len(run) * len(part.exact) <= MAX_EXACT:
                run = frozenset(a + b for a, b in product(run, part.exact))
            else:
                done, run, whole = _and(done, _as_clauses(run)), part.exact, False
        if whole:
            return _Info(run, done)
        return _Info(None, _and(done, _as_clauses(run)))

    def _repeat(self) -> _Info:
        atom = info = self._atom()
        start = self.i
        while True:
            c = self._peek()
            if c in ("*", "?"):
                self.i += 1
                info = _optional(info) if c == "?" else _UNKNOWN
            elif c == "+":
                self.i += 1
                info = _Info(None, _and(info.clauses, _as_clauses(info.exact)))
            elif c == "{" and (m := _REPEAT.match(self.p, self.i)):
                self.i = m.end()
                info = _counted(info, int(m.group(1)), None if m.group(2) and not m.group(3) else
                                int(m.group(3) or m.group(1)))
            else:
                return _REPEATED_BEFORE if atom is _FLAGS and self.i > start else info
            if self._peek() == "?":  # lazy: the same strings
                self.i += 1

    def _atom(self) -> _Info:
        c = self.p[self.i]
        self.i += 1
        if c == "(":
            return self._group()
        if c == "[":
            return self._class()
        if c == "\\":
            return self._escape()
        if c == ".":
            return _UNKNOWN
        if c in "^$":
            return _EMPTY
        return self._char(c)

    def _group(self) -> _Info:
        if self.p.startswith("?", self.i):
            if self.p.startswith(("?P<", "?<"), self.i):
                self.i = self.p.index(">", self.i) + 1
            else:  # (?flags) or (?flags:...)
                end = min(x for x in (self.p.find(")", self.i), self.p.find(":", self.i)) if x >= 0)
                self.i = end + 1
                if self.p[end] == ")":
                    return _FLAGS
        info = self.alternation()
        self.i += 1  # ")"
        return info

    def _escape(self) -> _Info:
        """After a backslash, outside a class."""
        c = self.p[self.i]
        if c == "Q":
            end = self.p.find("\\E", self.i + 1)
            text = self.p[self.i + 1 : end if end >= 0 else len(self.p)]
            self.i = end + 2 if end >= 0 else len(self.p)
            return _concat_chars([self._char(ch) for ch in text]) if text else _EMPTY
        if c in "bBAz":
            self.i += 1
            return _EMPTY
        literal = self._escape_char()
        return _UNKNOWN if literal is None else self._char(literal)

    def _escape_char(self) -> str | None:
        """Consume an escape (after its backslash): its character, or None when it is not one (``\\d``,
        ``\\pL``, an octal code, ...)."""
        if (m := _HEX.match(self.p, self.i)) is not None:
            self.i = m.end()
            return chr(int(m.group(1).strip("{}"), 16))
        c = self.p[self.i]
        self.i += 1
        if c in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[c]
        if c in "pP":
            self.i = self.p.index("}", self.i) + 1 if self._peek() == "{" else self.i + 1
        while c.isdigit() and self._peek().isdigit():
            self.i += 1
        return None if c.isalnum() else c

    def _class(self) -> _Info:
        """After ``[``: a class of a few known characters is their union; anything else is "any"."""
        negated = self._peek() == "^"
        self.i += negated
        chars: set[str] = set()
        known = not negated
        first = True
        while first or self._peek() != "]":
            first = False
            low = self._class_char()
            if self._peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                high = self._class_char()
                if low is None or high is None or ord(high) - ord(low) >= MAX_EXACT:
                    known = False
                    continue
                chars.update(map(chr, range(ord(low), ord(high) + 1)))
            elif low is None:
                known = False
            else:
                chars.add(low)
        self.i += 1  # "]"
        if not known or len(chars) > MAX_EXACT:
            return _UNKNOWN
        return _union(self._char(ch) for ch in chars)

    def _class_char(self) -> str | None:
        """One member of a class: its character, or None for ``[:alpha:]``, ``\\d`` and the like."""
        c = self.p[self.i]
        self.i += 1
        if c == "[" and self._peek() == ":":
            self.i = self.p.index(":]", self.i) + 2
            return None
        return self._escape_char() if c == "\\" else c

    def _char(self, c: str) -> _Info:
        if self.fold and not c.isascii() and c.lower() != c.upper():
            return _UNKNOWN
        return _Info(frozenset({normalized(c)}))


def _optional(info: _Info) -> _Info:
    if info.exact is not None and info.clauses == ANYTHING and len(info.exact) < MAX_EXACT:
        return _Info(info.exact | {b""})
    return _UNKNOWN


def _counted(info: _Info, low: int, high: int | None) -> _Info:
    if low == 0:
        return _optional(info) if high == 1 else _UNKNOWN
    if high == low and info.exact is not None and low <= 4 and len(info.exact) ** low <= MAX_EXACT:
        strings = frozenset(b"".join(p) for p in product(sorted(info.exact), repeat=low))
        return _Info(strings, info.clauses)
    return _Info(None, _and(info.clauses, _as_clauses(info.exact)))


def _union(parts: Iterable[_Info]) -> _Info:
    strings: set[bytes] = set()
    for part in parts:
        if part.exact is None:
            return _UNKNOWN
        strings |= part.exact
    return _Info(frozenset(strings)) if len(strings) <= MAX_EXACT else _UNKNOWN


def _concat_chars(parts: Sequence[_Info]) -> _Info:
    if any(p.exact is None for p in parts):
        return _UNKNOWN
    return _Info(frozenset({b"".join(next(iter(p.exact or ())) for p in parts)}))
