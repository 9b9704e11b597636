"""The grams a pattern requires: every line RE2 matches holds all the grams of at least one clause (else the
index would hide a match), and the requirement narrows as a reader of the pattern expects."""

from __future__ import annotations

import re2
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.index.store.grep_blocks import grams_of, normalized
from shardfuse.query.grep.regex_grams import ANYTHING, Clauses, literal_grams, required_grams

ALPHABET = "abcAB_( .\u212a\u017fkSsé\u00c9"
LINES = st.lists(st.text(alphabet=ALPHABET, max_size=24), min_size=1, max_size=12)
ATOMS = st.sampled_from([
    "a", "b", "c", "A", "B", "_", r"\(", r"\.", " ", ".", "k", "s", "S", "é", "É", r"\w", r"\s", "[ab]", "[^a]",
    "[a-c]", "[[:alpha:]]", r"\x61", r"\Qa.\E", "^", "$", r"\b", "(?i)", "(?i:ab)", "(?P<n>bc)", r"\pL",
])


@st.composite
def patterns(draw: st.DrawFn, depth: int = 0) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.integers(0, 9 if depth < 2 else 6))
        piece = draw(ATOMS) if kind < 7 else "(" + "|".join(
            draw(st.lists(patterns(depth + 1), min_size=1, max_size=3))) + ")"
        parts.append(piece + draw(st.sampled_from(["", "", "", "*", "+", "?", "{2}", "{1,3}", "{0,1}", "+?"])))
    return "".join(parts)


def _satisfies(clauses: Clauses, line: str) -> bool:
    present = set(grams_of(normalized(line)).tolist())
    return any(clause <= present for clause in clauses)


def _compiled(pattern: str, *, case_sensitive: bool, literal: bool = False) -> object | None:
    options = re2.Options()
    options.case_sensitive = case_sensitive
    options.literal = literal
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return None


@settings(max_examples=600, deadline=None)
@given(pattern=patterns(), lines=LINES, case_sensitive=st.booleans())
@example(pattern="(aaa)(?i)*", lines=[""], case_sensitive=False)  # RE2 repeats the group before the flags
def test_every_line_re2_matches_holds_a_required_clause(pattern: str, lines: list[str], case_sensitive: bool) -> None:
    compiled = _compiled(pattern, case_sensitive=case_sensitive)
    if compiled is None:
        return
    clauses = required_grams(pattern, case_sensitive=case_sensitive)
    for line in lines:
        if compiled.search(line) is not None:  # type: ignore[attr-defined]
            assert _satisfies(clauses, line), (pattern, line, case_sensitive)


@settings(max_examples=400, deadline=None)
@given(needle=st.text(alphabet=ALPHABET, min_size=1, max_size=8), lines=LINES, case_sensitive=st.booleans())
def test_every_line_holding_a_literal_holds_its_grams(needle: str, lines: list[str], case_sensitive: bool) -> None:
    compiled = _compiled(needle, case_sensitive=case_sensitive, literal=True)
    assert compiled is not None
    clauses = literal_grams(needle, case_sensitive=case_sensitive)
    for line in [*lines, f"x{needle.upper()}y", f"{needle.swapcase()}"]:
        if compiled.search(line) is not None:  # type: ignore[attr-defined]
            assert _satisfies(clauses, line), (needle, line, case_sensitive)


def _strings(clauses: Clauses) -> list[set[str]]:
    return [{bytes([(g >> 16) & 255, (g >> 8) & 255, g & 255]).decode("latin-1") for g in c} for c in clauses]


def test_literal_runs_alternations_and_repeats() -> None:
    assert _strings(required_grams(r"def \w+_task\(", case_sensitive=True)) == [
        {"def", "ef ", "_ta", "tas", "ask", "sk("}]
    assert sorted(map(sorted, _strings(required_grams("(get|set)_name", case_sensitive=True)))) == sorted(
        map(sorted, [{"_na", "et_", "get", "nam", "ame", "t_n"}, {"_na", "et_", "nam", "ame", "set", "t_n"}]))
    assert _strings(required_grams("colou?r", case_sensitive=True)) in (
        [{"col", "olo", "lor"}, {"col", "olo", "lou", "our"}], [{"col", "olo", "lou", "our"}, {"col", "olo", "lor"}])
    assert _strings(required_grams("(abc)+x*", case_sensitive=True)) == [{"abc"}]
    assert _strings(required_grams("Hello", case_sensitive=False)) == [{"hel", "ell", "llo"}]


def test_patterns_without_a_certain_gram_require_nothing() -> None:
    for pattern in (r"\w+", "ab", "abc|d", "(abc)?", "a.b.c", "[a-z]{3}", "(?:abc)*"):
        assert required_grams(pattern, case_sensitive=True) == ANYTHING, pattern


def test_case_insensitive_literals_skip_non_ascii_letters() -> None:
    # "ß" and "É" have other-case forms with other bytes: only the ASCII runs around them are required.
    assert _strings(literal_grams("Straße", case_sensitive=False)) == [{"str", "tra"}]
    assert _strings(literal_grams("Straße", case_sensitive=True)) != [{"str", "tra"}]
