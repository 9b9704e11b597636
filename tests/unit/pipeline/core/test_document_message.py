"""The embed message of a prepared document: each chunk's text travels once (the blocks hold it, and
``final_newline`` the final newline they drop), read back exactly; messages of older releases read as before;
a chunk without text that the blocks cannot give is a malformed message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.core.documents import Chunk, PreparedDocument, TextBlock
from shardfuse.pipeline.core.errors import InvalidEventError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store.grep_blocks import cut_blocks

EVENT = WriteEvent(op=Op.WRITE, zone="z", path="src/app.py", content_hash="sha256:" + "0" * 64, size=9, seq=3)
TEXT = "".join(f"def handler_{i}(request):\n    return respond(request.args['v{i}'] * {i})\n\n" for i in range(50))


def _chunk(text: str, ordinal: int, start: int, end: int, *, content: str | None = None) -> Chunk:
    return Chunk(ordinal=ordinal, text=text[start:end] if content is None else content, start_char=start,
                 end_char=end, start_line=text.count("\n", 0, start) + 1,
                 end_line=text.count("\n", 0, max(start, end - 1)) + 1, token_count=end - start)


def _document(text: str, spans: list[tuple[int, int]], *, max_lines: int = 64) -> PreparedDocument:
    chunks = tuple(_chunk(text, i, start, end) for i, (start, end) in enumerate(spans))
    return PreparedDocument(event=EVENT, shard=0, chunks=chunks, line_count=text.count("\n") + 1,
                            blocks=cut_blocks(text, max_lines=max_lines))


def _trip(document: PreparedDocument) -> PreparedDocument:
    return PreparedDocument.from_dict(json.loads(json.dumps(document.to_dict())))


def _with_every_text(document: PreparedDocument) -> dict[str, Any]:
    """The message as a release before this one wrote it: every chunk with its text."""
    return {**document.to_dict(), "chunks": [c.to_dict() for c in document.chunks]}


# Line boundaries, mid-line starts and ends, overlapping windows; the last ends one character short of the end.
SPANS = [(0, 400), (350, 1201), (1201, 1800), (1790, 2600), (2600, len(TEXT) - 1)]


def test_chunks_that_are_slices_of_the_blocks_travel_without_text_and_read_back_exactly() -> None:
    for max_lines in (3, 64):  # several blocks, and one
        document = _document(TEXT, SPANS, max_lines=max_lines)
        assert all("text" not in c for c in document.to_dict()["chunks"])
        assert _trip(document) == document


def test_a_chunk_that_is_not_its_slice_of_the_blocks_carries_its_text() -> None:
    document = _document(TEXT, SPANS)
    changed = _chunk(TEXT, 5, 0, 10, content="not the slice")
    document = PreparedDocument(event=EVENT, shard=0, chunks=(*document.chunks, changed), line_count=90,
                                blocks=document.blocks)
    assert ["text" in c for c in document.to_dict()["chunks"]] == [False] * 5 + [True]
    assert _trip(document) == document


def test_a_last_chunk_ending_on_the_final_newline_travels_without_text_too() -> None:
    # The blocks drop a document's final "\n"; the message says the document had one.
    document = _document(TEXT, [*SPANS, (2600, len(TEXT))])
    data = document.to_dict()
    assert data["final_newline"] is True
    assert all("text" not in c for c in data["chunks"])
    assert _trip(document) == document
    # A document whose chunks stop short of its final newline, or without one, keeps the older form.
    assert "final_newline" not in _document(TEXT, SPANS).to_dict()
    assert "final_newline" not in _document(TEXT.rstrip("\n"), [(0, 50), (50, len(TEXT.rstrip("\n")))]).to_dict()


def test_a_chunk_past_the_final_newline_is_malformed() -> None:
    data = _document(TEXT, [*SPANS, (2600, len(TEXT))]).to_dict()
    data["chunks"][-1]["end_char"] = len(TEXT) + 1
    with pytest.raises(InvalidEventError, match=r"chunk 5 \(ordinal 5\).*offsets"):
        PreparedDocument.from_dict(data)
    # Without the flag the same chunk is one character past the blocks' text.
    data = _document(TEXT, [*SPANS, (2600, len(TEXT))]).to_dict()
    del data["final_newline"]
    with pytest.raises(InvalidEventError, match=r"chunk 5 \(ordinal 5\).*offsets"):
        PreparedDocument.from_dict(data)


def test_blocks_that_are_not_the_whole_text_from_line_one_carry_every_text() -> None:
    document = _document(TEXT, SPANS, max_lines=3)
    for blocks in (document.blocks[1:], (document.blocks[0], *document.blocks[2:])):
        shifted = PreparedDocument(event=EVENT, shard=0, chunks=document.chunks, line_count=90, blocks=blocks)
        assert all("text" in c for c in shifted.to_dict()["chunks"])
        assert _trip(shifted) == shifted


def test_the_message_is_smaller() -> None:
    document = _document(TEXT, SPANS)
    size, before = len(json.dumps(document.to_dict())), len(json.dumps(_with_every_text(document)))
    assert size <= 0.7 * before


def test_messages_of_older_releases_read_as_before() -> None:
    document = _document(TEXT, SPANS)
    assert PreparedDocument.from_dict(_with_every_text(document)) == document
    without_blocks = {k: v for k, v in _with_every_text(document).items() if k != "blocks"}
    assert PreparedDocument.from_dict(without_blocks).chunks == document.chunks
    # A text carried wins over the blocks, as it always did.
    carried = _with_every_text(document)
    carried["chunks"][0]["text"] = "other"
    assert PreparedDocument.from_dict(carried).chunks[0].text == "other"


def test_a_release_before_this_one_dead_letters_a_chunk_without_text() -> None:
    # Its from_dict built each chunk with Chunk.from_dict, whose TypeError it turned into InvalidEventError.
    with pytest.raises(TypeError):
        Chunk.from_dict(_document(TEXT, SPANS).to_dict()["chunks"][0])


def _without_text(document: PreparedDocument, **changes: Any) -> dict[str, Any]:
    """The message with every chunk's text but chunk 1's, and ``changes`` made to chunk 1."""
    data = _with_every_text(document)
    data["chunks"][1] = {k: v for k, v in {**data["chunks"][1], **changes}.items() if k != "text"}
    return data


@pytest.mark.parametrize(
    "changes",
    [{"start_char": -1}, {"end_char": len(TEXT)}, {"start_char": 900, "end_char": 800}, {"start_char": "350"},
     {"end_char": 1201.0}, {"start_char": None}, {"start_char": True}, {"end_char": [1]}],
)
def test_a_chunk_without_text_and_offsets_outside_the_blocks_is_malformed(changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidEventError, match=r"chunk 1 \(ordinal 1\).*offsets"):
        PreparedDocument.from_dict(_without_text(_document(TEXT, SPANS), **changes))


def test_a_chunk_without_text_and_no_blocks_to_take_it_from_is_malformed() -> None:
    document = _document(TEXT, SPANS, max_lines=3)
    data = _without_text(document)
    for blocks in ([], [[b.start_line, b.text] for b in document.blocks[1:]]):
        with pytest.raises(InvalidEventError, match=r"chunk 1 \(ordinal 1\) has no text.*no blocks"):
            PreparedDocument.from_dict({**data, "blocks": blocks})


FRAGMENTS = ["a", "word ", "Straße", "日本語", "👍🏽", "e\u0301", "\n", "\n\n", "\r\n", "\r", "\t", " ", "\x00"]
texts = st.one_of(st.text(), st.lists(st.sampled_from(FRAGMENTS), max_size=80).map("".join))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), text=texts, max_lines=st.integers(1, 8))
def test_any_text_and_any_spans_read_back_exactly(data: st.DataObject, text: str, max_lines: int) -> None:
    offsets = st.integers(0, len(text))
    spans = data.draw(st.lists(st.tuples(offsets, offsets).map(sorted), max_size=6))
    chunks = [_chunk(text, i, start, end, content=data.draw(st.sampled_from([None, None, None, "x"])))
              for i, (start, end) in enumerate(spans)]
    document = PreparedDocument(event=EVENT, shard=0, chunks=tuple(chunks), line_count=text.count("\n") + 1,
                                blocks=cut_blocks(text, max_lines=max_lines))
    assert _trip(document) == document
    # The whole text travels in the blocks, its final "\n" only when a chunk ends on it as a slice.
    ends_on_it = any(c.end_char == len(text) > c.start_char and c.text == text[c.start_char:] for c in chunks)
    full = text[:-1] if text.endswith("\n") and not ends_on_it else text
    carried = [c.end_char > len(full) or c.text != full[c.start_char:c.end_char] or not document.blocks
               for c in chunks]
    assert ["text" in c for c in document.to_dict()["chunks"]] == carried


def test_blocks_hold_the_text_so_chunks_can_leave_theirs_out() -> None:
    # What the omission rests on: the blocks joined by "\n" are the text, but for a final "\n".
    for text in (TEXT, TEXT + "tail", "\r\n\r\n", "\n", "x"):
        assert "\n".join(b.text for b in cut_blocks(text, max_lines=2)) == text.removesuffix("\n")
    assert cut_blocks("") == () and TextBlock(1, "") == cut_blocks("\n")[0]
