from __future__ import annotations

import pytest

from shardfuse.query.ranking import diversify, snippet


def test_diversify_caps_chunks_per_file_and_keeps_order() -> None:
    hits = [("a.py", 1), ("a.py", 2), ("b.py", 3), ("a.py", 4), ("a.py", 5), ("b.py", 6)]
    kept = list(diversify(hits, key=lambda h: h[0], max_per_key=2))
    assert kept == [("a.py", 1), ("a.py", 2), ("b.py", 3), ("b.py", 6)]
    assert list(diversify(hits, key=lambda h: h[0], max_per_key=None)) == hits
    with pytest.raises(ValueError):
        list(diversify(hits, key=lambda h: h[0], max_per_key=0))


def test_snippet_folds_whitespace_and_cuts_at_a_word() -> None:
    assert snippet("short\n\ttext", max_chars=50) == "short text"
    assert snippet("alpha beta gamma delta epsilon", max_chars=17) == "alpha beta gamma…"
    assert len(snippet("x" * 100, max_chars=10)) == 10
