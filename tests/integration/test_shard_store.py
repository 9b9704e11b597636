"""ShardStore against real PostgreSQL + pgvector: version rules, tombstones and atomic replacement."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest

from shardfuse.pipeline.core.documents import Chunk, chunk_id
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.connections import open_pool
from shardfuse.pipeline.ingest.symbols import extract_symbols, language_for
from tests.integration.conftest import Stack, scratch_store

pytestmark = pytest.mark.integration
DIM = 16
EMBED = HashingEmbedder(DIM)


@pytest.fixture
def store(stack: Stack) -> Iterator[ShardStore]:
    with scratch_store(stack, "store", dimensions=DIM) as shard:
        yield shard


def _write(path: str, seq: int, texts: list[str], zone: str = "z") -> DocumentChange:
    event = WriteEvent(op=Op.WRITE, zone=zone, path=path, content_hash="sha256:" + "1" * 64, seq=seq)
    chunks = tuple(Chunk(i, t, 0, len(t), i + 1, i + 1, 2) for i, t in enumerate(texts))
    return DocumentChange(event=event, status=DocStatus.INDEXED, chunks=chunks,
                          embeddings=EMBED.embed_documents(texts), line_count=len(texts))


def _delete(path: str, seq: int) -> DocumentChange:
    return DocumentChange(event=WriteEvent(op=Op.DELETE, zone="z", path=path, seq=seq), status=DocStatus.DELETED)


def _chunks(store: ShardStore, path: str) -> list[tuple[int, str]]:
    with store.pool.connection() as conn:
        return conn.execute("SELECT seq, text FROM shard_0.chunks WHERE path = %s ORDER BY ordinal", (path,)).fetchall()


def test_newer_seq_replaces_older_and_stale_is_a_no_op(store: ShardStore) -> None:
    assert store.apply([_write("p", 5, ["v5 a", "v5 b"])])[0].applied
    assert _chunks(store, "p") == [(5, "v5 a"), (5, "v5 b")]
    stale = store.apply([_write("p", 4, ["v4"])])[0]
    assert (stale.applied, stale.stored_seq) == (False, 5)
    same = store.apply([_write("p", 5, ["v5 again"])])[0]  # redelivery of the same event: no-op
    assert not same.applied and _chunks(store, "p") == [(5, "v5 a"), (5, "v5 b")]
    assert store.apply([_write("p", 9, ["v9"])])[0].applied
    assert _chunks(store, "p") == [(9, "v9")]
    assert store.document_seq("z", "p") == 9 and store.document_seq("z", "never") is None


def test_delete_leaves_a_tombstone_that_blocks_older_writes(store: ShardStore) -> None:
    store.apply([_write("d", 1, ["text"])])
    assert store.apply([_delete("d", 3)])[0].applied
    assert _chunks(store, "d") == []
    assert not store.apply([_write("d", 2, ["late"])])[0].applied
    assert _chunks(store, "d") == []
    # a delete of a never-seen document still leaves a tombstone
    assert store.apply([_delete("unseen", 7)])[0].applied
    assert not store.apply([_write("unseen", 6, ["older"])])[0].applied
    assert store.apply([_write("unseen", 8, ["newer"])])[0].applied
    counts = {row["zone"]: row for row in store.zone_counts()}["z"]
    assert (counts["documents"], counts["deleted"]) == (1, 1)


def test_document_seqs_answers_a_batch_in_one_query_as_document_seq_does(store: ShardStore) -> None:
    store.apply([_write("a", 4, ["a"]), _write("b", 6, ["b"]), _write("a", 5, ["a again"])])
    store.apply([_delete("gone", 9)])
    store.apply([_write("other-zone", 3, ["x"], zone="y")])
    keys = [("z", "a"), ("z", "b"), ("z", "gone"), ("z", "never"), ("y", "other-zone"), ("y", "a")]
    assert store.document_seqs(keys) == {("z", "a"): 5, ("z", "b"): 6, ("z", "gone"): 9, ("y", "other-zone"): 3}
    assert all(store.document_seqs(keys).get(k) == store.document_seq(*k) for k in keys)
    assert store.document_seqs([]) == {}


def _fenced(change: DocumentChange, fence: int) -> DocumentChange:
    return dataclasses.replace(change, fence=fence)


def test_a_write_under_an_older_lease_is_refused_and_the_newest_token_is_remembered(store: ShardStore) -> None:
    # Worker A (token 5) stalls; its lease lapses; worker B (token 6) writes seq 10.
    assert store.apply([_fenced(_write("f", 10, ["B's seq 10"]), 6)])[0].applied
    # A wakes up with a newer seq but an older token: refused, not applied, and told the shard's token.
    late = store.apply([_fenced(_write("f", 11, ["A's seq 11"]), 5)])[0]
    assert (late.applied, late.fenced, late.stored_fence) == (False, True, 6)
    assert _chunks(store, "f") == [(10, "B's seq 10")]
    # Retried under a new lease (token 7), the same write goes through: delayed, never lost.
    again = store.apply([_fenced(_write("f", 11, ["A's seq 11"]), 7)])[0]
    assert again.applied and not again.fenced
    assert _chunks(store, "f") == [(11, "A's seq 11")]
    # A stale write under a newer lease still raises the shard's token; deletes are fenced the same way.
    assert not store.apply([_fenced(_write("f", 3, ["old"]), 9)])[0].applied
    refused = store.apply([dataclasses.replace(_delete("f", 12), fence=8)])[0]
    assert refused.fenced and refused.stored_fence == 9
    assert _chunks(store, "f") == [(11, "A's seq 11")]
    # A write without a lease (no token) is judged by seq alone.
    assert store.apply([_write("f", 13, ["unleased"])])[0].applied


def test_batch_with_two_versions_keeps_the_newest(store: ShardStore) -> None:
    outcomes = store.apply([_write("b", 2, ["two"]), _write("b", 1, ["one"]), _write("c", 1, ["c"])])
    assert {o.key[1]: o.seq for o in outcomes} == {"b": 2, "c": 1}
    assert _chunks(store, "b") == [(2, "two")]


def test_readers_see_the_old_version_or_the_new_one_never_a_mix_or_nothing(store: ShardStore) -> None:
    store.apply([_write("hot", 1, ["v1"] * 3)])
    seen: list[tuple[int, int, int]] = []
    stop = threading.Event()

    def read() -> None:
        with psycopg.connect(store.pool.conninfo, autocommit=True) as conn:
            while not stop.is_set():
                seen.append(conn.execute(
                    "SELECT count(*), min(seq), max(seq) FROM shard_0.chunks WHERE path = 'hot'").fetchone())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for seq in range(2, 60):
            store.apply([_write("hot", seq, [f"v{seq}"] * (1 + seq % 5))])
    finally:
        stop.set()
        reader.join()
    assert len(seen) > 20
    for count, low, high in seen:
        assert count > 0, "a reader saw the document with no chunks"
        assert low == high, "a reader saw chunks of two versions at once"
        assert count == 3 if low == 1 else count == 1 + low % 5


def test_vector_search_is_zone_filtered_and_exact_when_hnsw_comes_back_short(store: ShardStore) -> None:
    # One small zone inside a larger one: the HNSW scan's post-filter would return too few.
    store.apply([_write(f"big{i}", 1, [f"common words number {i}"], zone="big") for i in range(400)])
    store.apply([_write(f"small{i}", 1, [f"rare item {i}"], zone="small") for i in range(5)])
    query = EMBED.embed_query("common words")
    hits = store.vector_search(query, zone="small", limit=5, ef_search=10)
    assert len(hits) == 5
    records = store.fetch_chunks([h.chunk_id for h in hits], zone="small")
    assert {r.path for r in records.values()} == {f"small{i}" for i in range(5)}
    assert store.fetch_chunks([h.chunk_id for h in hits], zone="big") == {}
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)


def test_searches_set_ef_search_on_their_connection_and_hand_it_back_ready_for_writes(store: ShardStore) -> None:
    """Searches run in autocommit with ``hnsw.ef_search`` held by the connection's session: each search gets
    the ef_search it asks for (at least its limit), and the connection goes back to the pool out of
    autocommit, so a writer's statements still share one transaction."""
    store.apply([_write(f"d{i}", 1, [f"words number {i}"]) for i in range(50)])
    query = EMBED.embed_query("words")
    with open_pool(str(store.pool.conninfo), min_size=1, max_size=1) as pool:  # one connection: the searched one
        single = ShardStore(pool, 0, dimensions=DIM)
        for ef_search, limit, expected in ((77, 10, "77"), (77, 120, "120"), (33, 5, "33")):
            assert len(single.vector_search(query, zone="z", limit=limit, ef_search=ef_search)) == min(limit, 50)
            with pool.connection() as conn:
                assert not conn.autocommit
                assert conn.execute("SHOW hnsw.ef_search").fetchone() == (expected,)
        assert single.fetch_chunks([chunk_id("z", "d1", 1, 0)], zone="z")
        with pool.connection() as conn:
            assert not conn.autocommit
            conn.execute("CREATE TEMP TABLE t (x int)")
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            conn.rollback()


def test_schema_built_for_other_dimensions_is_refused(store: ShardStore) -> None:
    other = ShardStore(store.pool, 0, dimensions=DIM * 2)
    with pytest.raises(ConfigurationError, match=f"stores {DIM}-dimensional"):
        other.ensure_schema()


def test_lexical_rows_stream_every_chunk(store: ShardStore) -> None:
    store.apply([_write(f"f{i}", 1, [f"t{i}a", f"t{i}b"]) for i in range(30)])
    rows = list(store.iter_lexical_rows(batch_size=7))
    assert len(rows) == 60 and {r[1] for r in rows} == {"z"}
    assert np.all(np.diff([int(r[0], 16) for r in rows]) > 0)  # ordered by chunk id
    assert {r[2] for r in rows} == {f"f{i}" for i in range(30)}  # each chunk's document path
    # A delta reads a few documents' chunks the same way; a document that is not there has none.
    assert store.lexical_rows_for([("z", "f3"), ("z", "f7"), ("z", "gone"), ("other", "f3")]) == sorted(
        [r for r in rows if r[2] in ("f3", "f7")])


def test_a_filter_matching_one_percent_of_a_20000_chunk_zone_still_returns_k(store: ShardStore, tmp_path) -> None:
    from shardfuse.pipeline.index.lexical import LexicalShardReader, build_shard_index
    from shardfuse.pipeline.index.store import ChunkFilter

    changes = []
    for i in range(2000):  # 2,000 documents × 10 chunks; every 100th document is "rare"
        path = f"rare/doc{i}.txt" if i % 100 == 0 else f"common/doc{i}.txt"
        change = _write(path, 1, [f"shared topic words chunk {j} of document {i}" for j in range(10)])
        if i % 100 == 0:
            event = change.event.model_copy(update={"metadata": {"team": "x"}})
            change = DocumentChange(event=event, status=change.status, chunks=change.chunks,
                                    embeddings=change.embeddings, line_count=change.line_count)
        changes.append(change)
    for start in range(0, len(changes), 500):
        store.apply(changes[start:start + 500])
    query = EMBED.embed_query("shared topic words")
    for where in (ChunkFilter(path_prefix="rare/"), ChunkFilter(metadata={"team": "x"}),
                  ChunkFilter(path_prefix="rare/", metadata={"team": "x"})):
        hits = store.vector_search(query, zone="z", limit=10, ef_search=40, where=where)
        assert len(hits) == 10, where
        records = store.fetch_chunks([h.chunk_id for h in hits], zone="z")
        assert all(r.path.startswith("rare/") for r in records.values())
        allowed = store.matching_chunk_ids(zone="z", where=where)
        assert len(allowed) == 200  # 1% of 20,000
    rows = list(store.iter_lexical_rows())
    build_shard_index(tmp_path, 0, chunk_ids=[r[0] for r in rows], zones=[r[1] for r in rows],
                      texts=[r[3] for r in rows], built_version=1)
    keyword = LexicalShardReader(tmp_path, 0).search("shared topic words", zone="z", k=10, allowed=allowed)
    assert len(keyword) == 10 and {h.chunk_id for h in keyword} <= allowed
    # a prefix's LIKE wildcards are literal: "rare_" does not match "rare/"
    assert store.matching_chunk_ids(zone="z", where=ChunkFilter(path_prefix="rare_")) == frozenset()


def test_fetched_chunks_carry_their_symbols_and_document_metadata(store: ShardStore) -> None:
    code = "def load(path):\n    return open(path).read()\n\nclass Cache:\n    def get(self, key):\n"
    chunk = Chunk(0, code, 0, len(code), 1, 5, 20,
                  symbols=extract_symbols(code, language=language_for("src/cache.py")))
    prose = Chunk(1, "Notes about caching.", len(code), len(code) + 20, 6, 6, 4)
    metadata = {"title": "Cache helpers", "tags": ["cache", "io"], "description": "Loads and caches files."}
    event = WriteEvent(op=Op.WRITE, zone="z", path="src/cache.py", content_hash="sha256:" + "2" * 64, seq=1,
                       metadata=metadata)
    store.apply([DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(chunk, prose),
                                embeddings=EMBED.embed_documents([chunk.text, prose.text]), line_count=6)])
    store.apply([_write("plain.txt", 1, ["no metadata here"])])
    ids = {o: chunk_id("z", "src/cache.py", 1, o) for o in (0, 1)}
    plain_id = chunk_id("z", "plain.txt", 1, 0)
    records = store.fetch_chunks([*ids.values(), plain_id], zone="z")
    code_record, prose_record, plain = records[ids[0]], records[ids[1]], records[plain_id]
    assert code_record.symbols == ("load", "Cache", "get")
    assert (code_record.primary_symbol, code_record.role) == ("load", "complete")
    assert code_record.metadata == metadata == prose_record.metadata
    assert (prose_record.symbols, prose_record.primary_symbol, prose_record.role) == ((), None, None)
    assert plain.metadata == {} and plain.symbols == ()
    with store.pool.connection() as conn:
        stored = conn.execute("SELECT symbols FROM shard_0.chunks WHERE chunk_id = ANY(%s) ORDER BY ordinal",
                              (list(ids.values()),)).fetchall()
    # Each definition's lines, 0-based from the chunk's first line: what a result's jump-to-definition range uses.
    lines = [["load", 0, 1], ["Cache", 3, 4], ["get", 4, 4]]
    assert stored == [({"symbols": ["load", "Cache", "get"], "primary": "load", "role": "complete", "lines": lines},),
                      (None,)]


def test_a_shard_created_before_symbols_existed_gets_the_column(store: ShardStore) -> None:
    store.apply([_write("old.py", 1, ["def old(): pass"])])
    with store.pool.connection() as conn:
        conn.execute("ALTER TABLE shard_0.chunks DROP COLUMN symbols")
    store.ensure_schema()  # what every worker does at start
    (record,) = store.fetch_chunks([chunk_id("z", "old.py", 1, 0)], zone="z").values()
    assert (record.text, record.symbols, record.role) == ("def old(): pass", (), None)
    store.ensure_schema()  # and again, once the column exists: a no-op
    assert store.apply([_write("old.py", 2, ["def new(): pass"])])[0].applied
