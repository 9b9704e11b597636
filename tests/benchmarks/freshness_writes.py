"""What the freshness benchmarks share (bench_freshness.py, bench_freshness_nodes.py): a shard loaded straight
into its tables, its BM25 generation built and published as the maintenance worker publishes it, and
single-document writes through the running pipeline timed until each leg finds them.

The keyword leg may be watched through several :class:`LexicalShardReader` at once, each on its own directory
(the maintenance node's own, a query node's copy), so the cost of crossing nodes is measured write by write.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import psycopg
import redis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.lexical import LexicalShardReader, Tokenizer
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.publishing import ShardPublishing
from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.pipeline.index.maintenance import shard_mirror
from shardfuse.pipeline.index.store.changes import DocStatus, DocumentChange
from shardfuse.pipeline.index.store.shard_store import ShardStore
from tests.benchmarks.scale import corpus

ZONE = "fresh"
# Seconds a write may take to become searchable before the benchmark gives up on it.
_GIVE_UP_S = 60.0


def load_direct(store: ShardStore, start: int, stop: int, *, dimensions: int) -> float:
    """Write documents ``start..stop`` of the corpus (one chunk each) straight into the shard's tables."""
    started = time.perf_counter()
    docs = corpus(stop)[start:]
    rng = np.random.default_rng(start)
    for offset in range(0, len(docs), 2000):
        changes = []
        batch = docs[offset:offset + 2000]
        vectors = rng.standard_normal((len(batch), dimensions)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        for doc, vector in zip(batch, vectors, strict=True):
            chunk = Chunk(ordinal=0, text=doc.text, start_char=0, end_char=len(doc.text), start_line=1,
                          end_line=doc.text.count("\n") + 1, token_count=len(doc.text.split()))
            digest = hashlib.sha256(doc.text.encode()).hexdigest()
            event = WriteEvent(op=Op.WRITE, zone=ZONE, path=doc.path, seq=1, size=len(doc.text),
                               content_hash=f"sha256:{digest}")
            changes.append(DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(chunk,),
                                          embeddings=vector.reshape(1, -1), line_count=chunk.end_line))
        store.apply(changes)
    return time.perf_counter() - started


def published_indexer(settings: Settings, store: ShardStore, *,
                      publishing: ShardPublishing | None = None) -> ShardIndexer:
    """The running pipeline's BM25 indexer of ``store``'s shard, on the stack's own freshness records, publishing
    to the shard's PostgreSQL schema as the maintenance worker does (``publishing`` wraps that, to time it).

    A generation built any other way (into the directory alone) is not published: the worker's first delta
    would find nothing published and run a full merge instead."""
    bm25 = settings.bm25
    return ShardIndexer(root=settings.bm25_root, shard=store.shard, store=store,
                        freshness=Bm25Freshness(redis.Redis.from_url(settings.broker.url)),
                        tokenizer=Tokenizer(stem=bm25.stemming), k1=bm25.k1, b=bm25.b,
                        keep_generations=bm25.keep_generations,
                        publishing=publishing or shard_mirror(settings, store))


def settle(stack: Any, *, timeout: float = 600, quiet_s: float = 1.0) -> float:
    """Wait until the pipeline has nothing waiting or running (the maintenance queue included) and every
    shard's BM25 index is current, for ``quiet_s`` in a row; the seconds it took.

    A shard loaded straight into its tables looks behind to the maintenance workers' watchdog until the
    benchmark's own merge is published, and the watchdog sends it a rebuild meanwhile: a full merge that must
    not run during the timed writes."""
    from shardfuse.workers.monitor import broker_client, pending_work

    started = time.monotonic()
    quiet_since: float | None = None
    client = broker_client(stack.settings)
    try:
        while time.monotonic() - started < timeout:
            now = time.monotonic()
            if pending_work(stack.settings, client)["idle"]:
                quiet_since = quiet_since if quiet_since is not None else now
                if now - quiet_since >= quiet_s:
                    return now - started
            else:
                quiet_since = None
            time.sleep(0.1)
    finally:
        client.close()
    raise AssertionError(f"the pipeline did not settle in {timeout:g} s")


def unique_word(i: int) -> str:
    """A word no other document holds (letters only: the tokenizer splits at digits)."""
    letters = ""
    i += 26 * 26
    while i:
        i, r = divmod(i, 26)
        letters += chr(ord("a") + r)
    return f"zqx{letters}"


def chunk_committed(dsn: str, path: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM shard_0.chunks WHERE zone = %s AND path = %s", (ZONE, path)).fetchone() \
            is not None


def write_latencies(stack: Any, readers: Mapping[str, LexicalShardReader], *, label: str, words: int,
                    writes: int) -> tuple[list[float], dict[str, list[float]]]:
    """Publish ``writes`` single documents one at a time; per write, seconds to the vector leg, and to the
    keyword leg through each of ``readers`` (by name)."""
    vector_s: list[float] = []
    keyword_s: dict[str, list[float]] = {name: [] for name in readers}
    texts = corpus(50)
    for i in range(writes):
        word = unique_word(words + i)
        path = f"fresh/{label}/{i}.txt"
        text = f"{texts[i % len(texts)].text}\nFresh note {word}.\n"
        started = time.perf_counter()
        with stack.publisher() as publisher:
            publisher.write(zone=ZONE, path=path, data=text.encode())
        vec: float | None = None
        key: dict[str, float] = {}
        while vec is None or len(key) < len(readers):
            now = time.perf_counter() - started
            if now > _GIVE_UP_S:
                raise AssertionError(f"{path} not searchable after {_GIVE_UP_S:g} s (vector {vec}, keyword {key})")
            if vec is None and chunk_committed(stack.settings.postgres.dsn, path):
                vec = now
            for name, reader in readers.items():
                if name not in key and reader.search(word, zone=ZONE, k=3):
                    key[name] = time.perf_counter() - started
            time.sleep(0.01)
        vector_s.append(vec)
        for name in readers:
            keyword_s[name].append(key[name])
        time.sleep(0.2)  # one write at a time: the pipeline is idle between writes
    return vector_s, keyword_s
