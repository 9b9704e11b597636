"""The shared BM25 tokenizer."""

from __future__ import annotations

from pipeline.lexical import tokenize


def test_lower_cases_and_splits_on_non_word_characters() -> None:
    assert tokenize("Parse-JSON, quickly!") == ["parse", "json", "quickly"]


def test_drops_stopwords_and_one_character_tokens() -> None:
    assert tokenize("The x of a Y is in the box") == ["box"]


def test_keeps_identifiers_digits_and_non_ascii_words() -> None:
    assert tokenize("snake_case_name v2 42 déjà-vu") == ["snake_case_name", "v2", "42", "déjà", "vu"]


def test_text_without_words_gives_no_tokens() -> None:
    assert tokenize("") == []
    assert tokenize("  ... -- !! a I ") == []
