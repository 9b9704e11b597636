"""The ingest stage's decisions, over an in-memory CAS and a fake shard store."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest
from psycopg.types.json import Jsonb

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.documents import Chunk, PreparedDocument
from shardfuse.pipeline.core.errors import ContentNotFoundError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.index.store import ApplyOutcome, DocStatus, DocumentChange
from shardfuse.pipeline.index.store.rows import CHUNK_COLUMNS, CHUNK_TYPES, chunk_rows
from shardfuse.pipeline.ingest.stage import IngestOutcome, IngestResult, held_seqs, ingest_event
from shardfuse.pipeline.ingest.symbols import NO_SYMBOLS, Role
from shardfuse.pipeline.storage.cas import InMemoryContentStore

SETTINGS = Settings(shards=3, chunking={"max_tokens": 32, "overlap_tokens": 4})


class FakeShard:
    """Holds seq per document and applies the version rule the real store applies."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.seqs: dict[tuple[str, str], int] = {}
        self.applied: list[DocumentChange] = []

    def document_seq(self, zone: str, path: str) -> int | None:
        return self.seqs.get((zone, path))

    def document_seqs(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        self.batched_reads = getattr(self, "batched_reads", 0) + 1
        return {k: self.seqs[k] for k in keys if k in self.seqs}

    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        (change,) = changes
        held = self.seqs.get(change.key)
        fresh = held is None or change.event.seq > held
        if fresh:
            self.seqs[change.key] = change.event.seq
            self.applied.append(change)
        return [ApplyOutcome(change.key, change.event.seq, fresh, held)]


Env = tuple[InMemoryContentStore, list[FakeShard], TokenCounter]


@pytest.fixture
def env() -> Env:
    return InMemoryContentStore(), [FakeShard(i) for i in range(3)], TokenCounter()


def _write(cas: InMemoryContentStore, data: bytes, *, path: str = "src/a.py", seq: int = 1) -> WriteEvent:
    return WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash=cas.put(data), size=len(data), seq=seq)


def _ingest(event: WriteEvent, env: Env) -> IngestOutcome:
    cas, stores, counter = env
    return ingest_event(event, settings=SETTINGS, cas=cas, stores=stores, counter=counter)


def test_text_is_chunked_for_its_shard_with_lines(env: Env) -> None:
    text = "".join(f"def function_{i}(argument):\n    return argument * {i}\n" for i in range(40))
    outcome = _ingest(_write(env[0], text.encode()), env)
    assert outcome.result is IngestResult.PREPARED
    doc = outcome.document
    assert doc is not None and doc.shard == outcome.shard == shard_for("z", "src/a.py", 3)
    assert len(doc.chunks) > 3 and all(c.token_count <= 32 for c in doc.chunks)
    assert doc.chunks[0].start_line == 1 and doc.chunks[-1].end_line == 80 == doc.line_count  # 40 two-line functions
    assert "".join(text[c.start_char:c.end_char] for c in doc.chunks[:1]) == doc.chunks[0].text
    assert not any(store.applied for store in env[1])  # writes are applied by the embed stage


def test_stale_events_are_dropped_before_reading_content(env: Env) -> None:
    cas, stores, _ = env
    stores[shard_for("z", "src/a.py", 3)].seqs[("z", "src/a.py")] = 5
    missing = WriteEvent(op=Op.WRITE, zone="z", path="src/a.py", content_hash="sha256:" + "9" * 64, seq=5)
    assert _ingest(missing, env).result is IngestResult.STALE  # equal seq: a redelivery
    assert _ingest(_write(cas, b"older", seq=4), env).result is IngestResult.STALE


def test_a_batch_version_check_reads_each_shard_once_and_decides_as_the_per_event_check(env: Env) -> None:
    cas, stores, counter = env
    events = [_write(cas, f"doc {i}".encode(), path=f"d{i}.txt", seq=10) for i in range(12)]
    for event in events[:6]:  # half of them the shards hold already, at this seq or a newer one
        stores[shard_for("z", event.path, 3)].seqs[event.key] = 10 + events.index(event) % 2
    held = held_seqs(events, stores=stores, shards=3)  # type: ignore[arg-type]
    assert held == {e.key: 10 + i % 2 for i, e in enumerate(events[:6])}
    assert [getattr(s, "batched_reads", 0) for s in stores] == [1, 1, 1]
    for event in events:
        batched = ingest_event(event, settings=SETTINGS, cas=cas, stores=stores, counter=counter,  # type: ignore[arg-type]
                               held_seqs=held).result
        assert batched is _ingest(event, env).result
        assert batched is (IngestResult.STALE if event.key in held else IngestResult.PREPARED)


def test_delete_writes_a_tombstone_and_blocks_older_writes(env: Env) -> None:
    cas, stores, _ = env
    outcome = _ingest(WriteEvent(op=Op.DELETE, zone="z", path="src/a.py", seq=9), env)
    assert outcome.result is IngestResult.DELETED
    assert stores[outcome.shard].applied[-1].status is DocStatus.DELETED
    assert _ingest(_write(cas, b"late write", seq=8), env).result is IngestResult.STALE
    assert _ingest(_write(cas, b"new write", seq=10), env).result is IngestResult.PREPARED


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x7fELF\x02\x01\x01\x00\x00\x00" * 20, "binary"),
        (b"caf\xe9 au lait", "UTF-8"),
        (b"", "empty"),
    ],
)
def test_undecodable_content_is_recorded_as_skipped_with_its_reason(
    env: Env, data: bytes, reason: str
) -> None:
    outcome = _ingest(_write(env[0], data), env)
    assert outcome.result is IngestResult.SKIPPED and reason in (outcome.reason or "")
    change = env[1][outcome.shard].applied[-1]
    assert change.status is DocStatus.SKIPPED and reason in (change.reason or "")


def test_oversized_content_is_skipped(env: Env) -> None:
    cas, stores, counter = env
    small = Settings(limits={"max_file_bytes": 100})
    event = _write(cas, b"x" * 101)
    outcome = ingest_event(event, settings=small, cas=cas, stores=stores[:2], counter=counter)
    assert outcome.result is IngestResult.SKIPPED and "too large" in (outcome.reason or "")


def test_content_missing_from_the_cas_is_a_permanent_error(env: Env) -> None:
    event = WriteEvent(op=Op.WRITE, zone="z", path="p", content_hash="sha256:" + "7" * 64, seq=1)
    with pytest.raises(ContentNotFoundError):
        _ingest(event, env)


CODE = "".join(
    f"def handler_{i}(request):\n    value = request.args['v{i}']\n    return respond(value * {i})\n\n"
    for i in range(12)
)


def test_code_chunks_carry_their_symbols_and_survive_the_trip_to_the_embed_stage(env: Env) -> None:
    outcome = _ingest(_write(env[0], CODE.encode(), path="app/handlers.py"), env)
    doc = outcome.document
    assert doc is not None and len(doc.chunks) > 3
    first, last = doc.chunks[0], doc.chunks[-1]
    assert first.symbols.primary_symbol == "handler_0" and first.symbols.role is Role.COMPLETE
    defined = {name for chunk in doc.chunks for name in chunk.symbols.symbols}
    assert defined == {f"handler_{i}" for i in range(12)}
    assert last.symbols.role is not Role.DECLARATION  # the document ends with it: nothing is left open
    # chunks travel to the embed task as JSON
    assert PreparedDocument.from_dict(json.loads(json.dumps(doc.to_dict()))) == doc


def test_prose_chunks_have_no_symbols(env: Env) -> None:
    outcome = _ingest(_write(env[0], CODE.encode(), path="notes/handlers.md"), env)
    assert outcome.document is not None
    assert all(chunk.symbols == NO_SYMBOLS for chunk in outcome.document.chunks)


def test_a_chunk_sent_before_symbols_existed_still_reads() -> None:
    old = {"ordinal": 0, "text": "x", "start_char": 0, "end_char": 1, "start_line": 1, "end_line": 1, "token_count": 1}
    assert Chunk.from_dict(old).symbols == NO_SYMBOLS


def test_copy_rows_hold_symbols_as_jsonb_and_null_for_prose(env: Env) -> None:
    outcome = _ingest(_write(env[0], CODE.encode(), path="app/handlers.py"), env)
    assert outcome.document is not None
    prose = Chunk(ordinal=99, text="plain words", start_char=0, end_char=11, start_line=1, end_line=1, token_count=2)
    chunks = (*outcome.document.chunks, prose)
    change = DocumentChange(event=outcome.document.event, status=DocStatus.INDEXED, chunks=chunks,
                            embeddings=np.zeros((len(chunks), 4), dtype=np.float32))
    rows = [dict(zip(CHUNK_COLUMNS, row, strict=True)) for row in chunk_rows(change)]
    assert len(CHUNK_TYPES) == len(CHUNK_COLUMNS) and CHUNK_TYPES[CHUNK_COLUMNS.index("symbols")] == "jsonb"
    assert isinstance(rows[0]["symbols"], Jsonb)
    assert rows[0]["symbols"].obj == outcome.document.chunks[0].symbols.to_json()
    assert rows[0]["symbols"].obj["primary"] == "handler_0" and rows[0]["symbols"].obj["role"] == "complete"
    assert rows[-1]["symbols"] is None
