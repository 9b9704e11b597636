"""BraceTokens.scan (running sums over the tokens, no Python step a token) against the plain reading: one token
at a time, depths counted as it goes, each "}" paired with the last open "{"."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.ingest.symbols.braces import BraceTokens

_TOKEN = re.compile(r"=>|[=!<>]=|[{}()\[\];=\n]")


def _one_token_at_a_time(code: str) -> tuple[list[int], list[str], list[int], list[int], list[int], bool]:
    pos, tok, paren, brace, match, opened = [], [], [], [], [], []
    p = b = 0
    closes_outer = False
    for m in _TOKEN.finditer(code):
        pos.append(m.start())
        tok.append(m.group())
        paren.append(p)
        brace.append(b)
        match.append(-1)
        if m.group() == "{":
            opened.append(len(tok) - 1)
            b += 1
        elif m.group() == "}":
            b -= 1
            if opened:
                match[opened.pop()] = len(tok) - 1
            else:
                closes_outer = True
        elif m.group() in ("(", "["):
            p += 1
        elif m.group() in (")", "]"):
            p -= 1
    return pos, tok, [*paren, p], [*brace, b], match, closes_outer


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("{}()[];=!<>\n a_é中")), max_size=80))
def test_the_scan_reads_what_one_token_at_a_time_reads(code: str) -> None:
    tokens = BraceTokens.scan(code)
    got = (tokens.pos, tokens.tok, tokens.paren, tokens.brace, tokens.match, tokens.closes_outer)
    assert got == _one_token_at_a_time(code)


def test_depths_are_before_each_token_and_after_the_last() -> None:
    tokens = BraceTokens.scan("f(a) { g[1]; } }")
    assert tokens.tok == ["(", ")", "{", "[", "]", ";", "}", "}"]
    assert tokens.paren == [0, 1, 0, 0, 1, 0, 0, 0, 0]
    assert tokens.brace == [0, 0, 0, 1, 1, 1, 1, 0, -1]
    assert tokens.match[2] == 6 and tokens.closes_outer
