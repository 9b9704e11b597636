"""The grep index's pure data: blocks of whole lines, their grams, and the chunk that holds each line."""

from __future__ import annotations

import pytest

from shardfuse.pipeline.core.documents import Chunk, PreparedDocument, TextBlock, chunk_id
from shardfuse.pipeline.core.errors import InvalidEventError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store.grep_blocks import (
    block_grams,
    block_rows,
    cut_blocks,
    grams_of,
    line_chunk_id,
    normalized,
    zone_gram,
)


def _lines(blocks: tuple[TextBlock, ...]) -> list[tuple[int, str]]:
    return [(b.start_line + i, line) for b in blocks for i, line in enumerate(b.text.split("\n"))]


def test_blocks_hold_every_line_once_with_its_number() -> None:
    text = "".join(f"line {i}\n" for i in range(1, 201)) + "last without newline"
    blocks = cut_blocks(text, max_lines=64)
    assert _lines(blocks) == list(enumerate(text.split("\n"), start=1))
    assert [b.start_line for b in blocks] == [1, 65, 129, 193]


def test_a_final_newline_ends_the_last_line_and_empty_lines_count() -> None:
    assert _lines(cut_blocks("a\n\nb\n")) == [(1, "a"), (2, ""), (3, "b")]
    assert _lines(cut_blocks("a\r\nb")) == [(1, "a\r"), (2, "b")]


def test_a_block_ends_at_the_character_budget_but_a_long_line_stays_whole() -> None:
    long = "x" * 10_000
    blocks = cut_blocks(f"a\n{long}\nb\nc", max_chars=100)
    assert [b.text for b in blocks] == ["a\n" + long, "b\nc"]


def test_grams_are_case_folded_bytes_and_the_zone_gram_is_negative() -> None:
    assert normalized("HeLLo") == b"hello"
    assert normalized("\u212aelvin \u017fs") == b"kelvin ss"  # the Kelvin sign and the long s fold to ASCII
    assert normalized("Äb") == "Äb".encode()  # non-ASCII letters keep their bytes
    packed = grams_of(b"abcd").tolist()
    assert packed == sorted([(97 << 16) | (98 << 8) | 99, (98 << 16) | (99 << 8) | 100])
    assert grams_of(b"ab").tolist() == []
    assert zone_gram("a") < 0 and zone_gram("a") != zone_gram("b")
    assert block_grams("ABC", "z") == [zone_gram("z"), (97 << 16) | (98 << 8) | 99]


@pytest.mark.parametrize("data", [b"abc", b"aaaa", b"abcabcabc", bytes(range(256)) * 3, "Kälte \u2603 x".encode()])
def test_the_grams_are_every_distinct_trigram_once_ascending(data: bytes) -> None:
    every = [(data[i] << 16) | (data[i + 1] << 8) | data[i + 2] for i in range(len(data) - 2)]
    assert grams_of(data).tolist() == sorted(set(every))


def _chunk(ordinal: int, start: int, end: int) -> Chunk:
    return Chunk(ordinal=ordinal, text="t", start_char=0, end_char=1, start_line=start, end_line=end, token_count=1)


def test_each_line_names_the_chunk_that_holds_it() -> None:
    chunks = (_chunk(0, 1, 30), _chunk(1, 30, 70), _chunk(2, 75, 80))  # 71-74: lines no chunk holds
    blocks = cut_blocks("".join(f"{i}\n" for i in range(1, 81)), max_lines=64)
    rows = list(block_rows(zone="z", path="p", seq=7, blocks=blocks, chunks=chunks))
    assert [r[2] for r in rows] == [0, 1] and [r[4] for r in rows] == [1, 65]
    first, second = rows[0][6], rows[1][6]
    assert first == [0, 1, 30, 1, 30, 70] and second == [1, 30, 70, 2, 75, 80]
    assert line_chunk_id(zone="z", path="p", seq=7, spans=first, line=30) == chunk_id("z", "p", 7, 0)
    assert line_chunk_id(zone="z", path="p", seq=7, spans=second, line=66) == chunk_id("z", "p", 7, 1)
    assert line_chunk_id(zone="z", path="p", seq=7, spans=second, line=72) is None
    assert line_chunk_id(zone="z", path="p", seq=7, spans=second, line=80) == chunk_id("z", "p", 7, 2)


def test_prepared_documents_carry_blocks_and_read_messages_without_them() -> None:
    event = WriteEvent(op=Op.WRITE, zone="z", path="a.py", content_hash="sha256:" + "0" * 64, size=3, seq=1)
    document = PreparedDocument(event=event, shard=0, chunks=(), line_count=2,
                                blocks=(TextBlock(start_line=1, text="a\nb"),))
    assert PreparedDocument.from_dict(document.to_dict()) == document
    old = {k: v for k, v in document.to_dict().items() if k != "blocks"}
    assert PreparedDocument.from_dict(old).blocks == ()


def test_malformed_blocks_make_a_document_unreadable() -> None:
    event = WriteEvent(op=Op.WRITE, zone="z", path="a.py", content_hash="sha256:" + "0" * 64, size=3, seq=1)
    data = PreparedDocument(event=event, shard=0, chunks=(), line_count=1).to_dict()
    for bad in ([[0, "a"]], [[1, 2]], [[1]], ["text"]):
        with pytest.raises(InvalidEventError, match="malformed embed document"):
            PreparedDocument.from_dict({**data, "blocks": bad})
