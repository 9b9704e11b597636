"""TokenCounter: tiktoken counting, and token boundaries mapped to character offsets."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.token_counting import TokenCounter


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def test_counts_and_encodes_with_cl100k(counter: TokenCounter) -> None:
    assert counter.encoding_name == "cl100k_base"
    assert counter.encode("hello world") == [15339, 1917]
    assert counter.count("hello world") == 2
    assert counter.count("") == 0
    assert counter.decode([15339, 1917]) == "hello world"


def test_special_token_text_is_ordinary_text(counter: TokenCounter) -> None:
    # A document may contain "<|endoftext|>"; it must be counted, not rejected or treated as a control.
    tokens = counter.encode("a <|endoftext|> b")
    assert 100257 not in tokens
    assert counter.decode(tokens) == "a <|endoftext|> b"


def test_offsets_for_ascii(counter: TokenCounter) -> None:
    offsets = counter.encode_with_offsets("hello world")
    assert offsets.tokens == [15339, 1917]
    assert offsets.char_bounds.tolist() == [0, 5, 11]


def test_offsets_snap_down_inside_multibyte_characters(counter: TokenCounter) -> None:
    text = "x🧑‍🚀 é𝔘"
    offsets = counter.encode_with_offsets(text)
    expected = tiktoken.get_encoding("cl100k_base").decode_with_offsets(offsets.tokens)[1]
    assert offsets.char_bounds.tolist() == [*expected, len(text)]


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_offsets_match_tiktoken_decode_with_offsets(counter: TokenCounter, text: str) -> None:
    offsets = counter.encode_with_offsets(text)
    assert offsets.tokens == counter.encode(text)
    _, expected = tiktoken.get_encoding("cl100k_base").decode_with_offsets(offsets.tokens)
    bounds = offsets.char_bounds.tolist()
    assert bounds == [*expected, len(text)]
    assert bounds == sorted(bounds)


def test_unknown_encoding_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown tiktoken encoding 'nope'"):
        TokenCounter("nope")


def test_offline_without_cache_says_how_to_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # An empty cache forces tiktoken to download; make the download fail as it does on an offline host.
    def offline(blobpath: str) -> bytes:
        raise OSError(f"network is unreachable: {blobpath}")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    # An encoding no other test loads, so tiktoken's per-process memo cannot hide the failure.
    with pytest.raises(ConfigurationError, match="TIKTOKEN_CACHE_DIR") as info:
        TokenCounter("p50k_base")
    assert "export TIKTOKEN_CACHE_DIR=" in str(info.value)
