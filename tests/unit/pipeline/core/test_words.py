from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shardfuse.pipeline.core.words import WORD, words


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=300))
def test_ascii_text_is_read_into_the_words_the_regex_finds(text: str) -> None:
    # Every ASCII character: punctuation, control characters and the separators str.split() takes for spaces.
    assert words(text) == WORD.findall(text)


@given(st.text(max_size=300))
def test_any_text_is_read_into_the_words_the_regex_finds(text: str) -> None:
    assert words(text) == WORD.findall(text)


def test_every_ascii_character_outside_words_separates_them() -> None:
    text = "".join(f"a{chr(c)}b" for c in range(128))
    assert words(text) == WORD.findall(text)
    assert words("alpha_beta\x1fgamma\x0b(délta) naïve") == ["alpha_beta", "gamma", "délta", "naïve"]
