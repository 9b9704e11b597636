from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardfuse.pipeline.core.words import WORD
from shardfuse.pipeline.index.lexical import Tokenizer, split_identifier
from shardfuse.pipeline.index.lexical import tokenizer as tokenizer_module

PLAIN = Tokenizer(stem=False)
STEMMED = Tokenizer(stem=True)


def test_identifiers_split_at_every_convention() -> None:
    assert split_identifier("getUserID") == ["get", "User", "ID"]
    assert split_identifier("HTTPServer2Go") == ["HTTP", "Server", "2", "Go"]
    assert split_identifier("SCREAMING_SNAKE_CASE") == ["SCREAMING", "SNAKE", "CASE"]
    assert split_identifier("snake_case_name") == ["snake", "case", "name"]
    assert split_identifier("parseJSON") == ["parse", "JSON"]
    assert split_identifier("utf8Decode") == ["utf", "8", "Decode"]


def test_parts_and_the_whole_identifier_are_both_tokens() -> None:
    assert PLAIN("def getUserId(user_id):") == ["get", "user", "id", "getuserid", "user", "id", "user_id"]
    assert PLAIN("XMLHttpRequest") == ["xml", "http", "request", "xmlhttprequest"]


def test_prose_is_lower_cased_without_english_or_code_stopwords() -> None:
    assert PLAIN("The Parse of a JSON is in the Box") == ["parse", "json", "box"]
    assert PLAIN("return self.value if True else None") == ["value"]
    assert PLAIN("") == [] and PLAIN("  ... -- !! a I ") == []


def test_stemming_is_optional_and_changes_the_name() -> None:
    assert STEMMED("running runners ran studies") == ["run", "runner", "ran", "studi"]
    assert PLAIN("running runners") == ["running", "runners"]
    assert STEMMED.name != PLAIN.name  # an index built with one is never searched with the other
    # whole identifiers are kept as written, not stemmed
    assert "parsingrules" in STEMMED("parsingRules") and "pars" in STEMMED("parsingRules")


def test_other_scripts_keep_their_words() -> None:
    assert PLAIN("naïve café 東京 déjà-vu") == ["naïve", "café", "東京", "déjà", "vu"]


@given(st.text(max_size=200))
def test_any_text_tokenizes_to_lower_case_non_stopword_tokens(text: str) -> None:
    for token in STEMMED(text):
        assert token and token == token.lower() or not token.isascii()
        assert token not in {"the", "self", "return"}


def test_remembered_words_give_the_same_tokens_and_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "getUserId parses the HTTPServer2 response; getUserId again, and parsing parsers"
    fresh = Tokenizer()(text)
    tokenizer = Tokenizer()
    monkeypatch.setattr(tokenizer_module, "WORD_CACHE_SIZE", 3)
    assert tokenizer(text) == fresh and tokenizer(text) == fresh  # cleared when full, same tokens after
    assert len(tokenizer._words) <= 3


def _by_the_regex(tokenizer: Tokenizer, text: str) -> list[str]:
    """The tokens of ``text`` with every word found by ``\\w+`` (what ASCII text is read by at C speed)."""
    return [token for word in WORD.findall(text) for token in tokenizer._word_tokens(word)]


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=300))
def test_ascii_text_is_read_into_the_same_words_as_the_regex_reads(text: str) -> None:
    # Every ASCII character: punctuation, control characters and the separators str.split() takes for spaces.
    assert STEMMED(text) == _by_the_regex(STEMMED, text)


def test_every_ascii_character_outside_words_separates_them() -> None:
    text = "".join(f"a{chr(c)}b" for c in range(128))
    assert text.isascii() and STEMMED(text) == _by_the_regex(STEMMED, text)
    assert PLAIN("alpha_beta\x1fgamma\x0b(delta)") == ["alpha", "beta", "alpha_beta", "gamma", "delta"]

