"""chunk_text: token windows whose text, offsets, lines and token counts always agree with the source."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.token_windows import chunk_text


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def assert_invariants(text: str, chunks: list[Chunk], counter: TokenCounter, max_tokens: int) -> None:
    if not text:
        assert chunks == []
        return
    assert chunks, "non-empty text must give at least one chunk"
    assert chunks[0].start_char == 0
    assert chunks[-1].end_char == len(text)
    for i, chunk in enumerate(chunks):
        assert chunk.ordinal == i
        assert 0 <= chunk.start_char < chunk.end_char <= len(text)
        assert chunk.text == text[chunk.start_char : chunk.end_char]
        assert chunk.token_count == counter.count(chunk.text)
        assert chunk.token_count <= max_tokens
        assert chunk.start_line == text.count("\n", 0, chunk.start_char) + 1
        assert chunk.end_line == text.count("\n", 0, chunk.end_char - 1) + 1
        if i:
            previous = chunks[i - 1]
            assert previous.start_char < chunk.start_char <= previous.end_char


FRAGMENTS = [
    "a", "word ", "Straße", "naïve", "e\u0301", "\u0301", "日本語", "한국어", "👍", "👍🏽", "🧑‍🚀", "🇫🇷",
    "𝔘", "\n", "\r\n", "\r", "\t", "    ", " ", "<|endoftext|>", "def f(x):\n    return x\n", "ok.", "1234",
    "\u200b", "\ufeff", "\x00", "ﷺ",
]
mixed_text = st.one_of(
    st.text(),
    st.lists(st.sampled_from(FRAGMENTS), max_size=200).map("".join),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=120).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(text=mixed_text, max_tokens=st.integers(4, 48), overlap_share=st.floats(0, 0.95))
def test_invariants_on_arbitrary_unicode(
    counter: TokenCounter, text: str, max_tokens: int, overlap_share: float
) -> None:
    overlap = min(int(max_tokens * overlap_share), max_tokens - 1)
    chunks = chunk_text(text, counter=counter, max_tokens=max_tokens, overlap_tokens=overlap)
    assert_invariants(text, chunks, counter, max_tokens)


def test_empty_text_gives_no_chunks(counter: TokenCounter) -> None:
    assert chunk_text("", counter=counter, max_tokens=16, overlap_tokens=2) == []


def test_whitespace_only_text_is_one_chunk(counter: TokenCounter) -> None:
    chunks = chunk_text(" \n\n\t \n", counter=counter, max_tokens=16, overlap_tokens=2)
    assert [(c.text, c.start_line, c.end_line) for c in chunks] == [(" \n\n\t \n", 1, 3)]


def test_short_text_is_one_chunk_with_lines(counter: TokenCounter) -> None:
    text = "first line\nsecond line\nthird"
    [chunk] = chunk_text(text, counter=counter, max_tokens=64, overlap_tokens=8)
    assert (chunk.text, chunk.start_line, chunk.end_line) == (text, 1, 3)
    assert chunk.token_count == counter.count(text)


def test_chunk_ending_after_newline_ends_on_that_line(counter: TokenCounter) -> None:
    text = "".join(f"line number {i} has a few words in it\n" for i in range(1, 41))
    chunks = chunk_text(text, counter=counter, max_tokens=40, overlap_tokens=0)
    assert len(chunks) > 1
    for chunk in chunks:
        # Every window ends at a line end here, so each chunk holds whole lines.
        assert chunk.text.endswith("\n")
        assert chunk.text.count("\n") == chunk.end_line - chunk.start_line + 1
        assert chunk.text.startswith(f"line number {chunk.start_line} ")
    assert chunks[-1].end_line == 40


def test_consecutive_chunks_overlap_by_about_the_overlap(counter: TokenCounter) -> None:
    text = " ".join(f"token{i}" for i in range(2000))
    chunks = chunk_text(text, counter=counter, max_tokens=100, overlap_tokens=20)
    assert all(c.token_count <= 100 for c in chunks)
    for previous, chunk in zip(chunks, chunks[1:], strict=False):
        shared = text[chunk.start_char : previous.end_char]
        assert 15 <= counter.count(shared) <= 25
    # Most windows are full: the window is measured in tokens, not characters.
    assert sum(c.token_count >= 90 for c in chunks) >= len(chunks) - 1


def test_crlf_is_kept_and_lines_count_newlines(counter: TokenCounter) -> None:
    text = "alpha\r\nbeta\r\ngamma\r\n" * 30
    chunks = chunk_text(text, counter=counter, max_tokens=16, overlap_tokens=4)
    assert_invariants(text, chunks, counter, 16)
    assert chunks[-1].end_line == 90
    assert all("\r\n" in c.text for c in chunks)


def test_long_run_of_multibyte_characters(counter: TokenCounter) -> None:
    # Emoji and rare CJK split into several byte-level tokens; windows must still cut between characters.
    text = "🧑‍🚀𠀋👍🏽" * 400
    chunks = chunk_text(text, counter=counter, max_tokens=7, overlap_tokens=3)
    assert_invariants(text, chunks, counter, 7)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(3, 0), (16, 16), (16, -1)])
def test_rejects_impossible_windows(counter: TokenCounter, max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_text("text", counter=counter, max_tokens=max_tokens, overlap_tokens=overlap)


def _stdlib_source(size: int) -> str:
    """About ``size`` characters of real Python: the standard library's own modules, in a fixed order."""
    parts: list[str] = []
    total = 0
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        part = path.read_text(encoding="utf-8")
        parts.append(part)
        total += len(part)
        if total >= size:
            break
    return "".join(parts)[:size]


def test_one_megabyte_of_python_is_chunked_correctly(counter: TokenCounter) -> None:
    # Its speed is measured in tests/benchmarks/bench_chunking.py, not asserted here.
    text = _stdlib_source(1_000_000)
    chunks = chunk_text(text, counter=counter, max_tokens=256, overlap_tokens=32)
    assert chunks[0].start_char == 0 and chunks[-1].end_char == len(text)
    for previous, chunk in zip(chunks, chunks[1:], strict=False):
        assert previous.start_char < chunk.start_char <= previous.end_char
    sample = chunks[:: max(1, len(chunks) // 50)]
    for chunk in sample:
        assert chunk.text == text[chunk.start_char : chunk.end_char]
        assert chunk.token_count == counter.count(chunk.text) <= 256
        assert chunk.start_line == text.count("\n", 0, chunk.start_char) + 1
        assert chunk.end_line == text.count("\n", 0, chunk.end_char - 1) + 1
    # Code has a line end in nearly every window's last quarter.
    assert sum(c.text.endswith("\n") for c in chunks) >= 0.9 * len(chunks)
