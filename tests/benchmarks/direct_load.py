"""Shards loaded directly, as the pipeline would have written them, for benchmarks that need a large corpus
indexed faster than the pipeline indexes it.

Each document goes through the pipeline's own stages, minus the broker: decoded by
:func:`shardfuse.pipeline.ingest.decode.decode_content`, chunked and contextualized by
:func:`shardfuse.pipeline.ingest.preparation.prepare_chunks`
(the ingest stage's call, with the stack's settings), placed by :func:`shardfuse.pipeline.core.sharding.shard_for`,
embedded by the
stack's embedder (``embed_documents`` over each chunk's ``indexed_text``, as the embed stage does), and written
by :meth:`shardfuse.pipeline.index.store.ShardStore.apply` (the embed stage's write path: placeholder rows, version
check, binary
``COPY`` of the chunk rows and the grep index's blocks) in batches, with the HNSW index deferred for the load
and built afterwards exactly as bulk-load mode does (``defer_vector_index``/``build_vector_index``). Each
shard's BM25 index is then built as
``shardfuse.bm25_rebuild`` builds it: the freshness counter bumped as a commit would, then a full build (a
merge, :meth:`shardfuse.pipeline.index.lexical.updates.ShardIndexer.merge`, published to the shard's
database) with the stack's tokenizer, ``k1``, ``b`` and ``keep_generations``.
So queries see what the pipeline would have produced.
"""

from __future__ import annotations

import hashlib
import mimetypes
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import redis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.documents import Chunk, TextBlock
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.providers import build_embedder
from shardfuse.pipeline.index.lexical import Tokenizer
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.maintenance import shard_indexer
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardPools
from shardfuse.pipeline.index.store.grep_blocks import cut_blocks
from shardfuse.pipeline.ingest.decode import Decoded, decode_content
from shardfuse.pipeline.ingest.preparation import prepare_chunks
from tests.benchmarks.scale import Doc

APPLY_BATCH = 200  # documents per shard transaction


@dataclass(frozen=True)
class Prepared:
    shard: int
    event: WriteEvent
    chunks: tuple[Chunk, ...]
    line_count: int
    # The text in blocks of lines for the grep index, as the ingest stage cuts it.
    blocks: tuple[TextBlock, ...] = ()


@dataclass(frozen=True)
class LoadTimes:
    chunks: int
    documents: int
    write_s: float
    hnsw_s: float
    bm25_s: float


def prepare(docs: Sequence[Doc], *, zone: str, settings: Settings, max_chunks: int,
            processes: int = 2) -> list[Prepared]:
    """The documents chunked as the ingest stage chunks them, in order, up to the first that reaches
    ``max_chunks`` chunks in total."""
    step = 500
    batches = [list(docs[i : i + step]) for i in range(0, len(docs), step)]
    out: list[Prepared] = []
    total = 0
    with ProcessPoolExecutor(max_workers=processes) as pool:
        for part in pool.map(_prepare_batch, batches, [zone] * len(batches), [settings] * len(batches)):
            for prepared in part:
                if total >= max_chunks:
                    return out
                out.append(prepared)
                total += len(prepared.chunks)
    return out


def _prepare_batch(docs: list[Doc], zone: str, settings: Settings) -> list[Prepared]:
    counter = TokenCounter(settings.chunking.encoding)
    out = []
    for seq, doc in enumerate(docs, start=1):
        data = doc.text.encode("utf-8")
        decoded = decode_content(data, max_bytes=settings.limits.max_file_bytes)
        assert isinstance(decoded, Decoded), doc.path
        content_hash = "sha256:" + hashlib.sha256(data).hexdigest()
        event = WriteEvent(op=Op.WRITE, zone=zone, path=doc.path, content_hash=content_hash, size=len(data),
                           mime=mimetypes.guess_type(doc.path)[0], seq=seq)
        chunks = prepare_chunks(decoded.text, path=doc.path, doc_hash=content_hash, settings=settings,
                                counter=counter, zone=zone).chunks
        if chunks:
            out.append(Prepared(shard_for(zone, doc.path, settings.shards), event, chunks, decoded.line_count,
                                cut_blocks(decoded.text)))
    return out


def chunk_texts(prepared: Sequence[Prepared]) -> list[str]:
    """What BM25 indexes for each chunk (the context, then the chunk), in order."""
    return [chunk.indexed_text for p in prepared for chunk in p.chunks]


def load(settings: Settings, prepared: Sequence[Prepared], *, processes: int = 2) -> LoadTimes:
    """Write ``prepared`` into the stack's shards (embedded), then build the HNSW and BM25 indexes."""
    by_shard: dict[int, list[Prepared]] = defaultdict(list)
    for p in prepared:
        by_shard[p.shard].append(p)
    started = time.perf_counter()
    with ShardPools(settings, min_size=1, max_size=2) as pools:
        stores = pools.stores()
        for store in stores:
            store.ensure_schema()
            store.defer_vector_index()
        batches = [(shard, docs[i : i + APPLY_BATCH]) for shard, docs in sorted(by_shard.items())
                   for i in range(0, len(docs), APPLY_BATCH)]
        with ProcessPoolExecutor(max_workers=processes) as pool:
            changes = pool.map(_embedded, [b for _, b in batches], [settings] * len(batches))
            for (shard, _), batch in zip(batches, changes, strict=True):
                outcomes = stores[shard].apply(batch)
                assert all(o.applied for o in outcomes)
        written = time.perf_counter()
        for store in stores:
            store.build_vector_index()
        indexed = time.perf_counter()
        client = redis.Redis.from_url(settings.broker.url)
        freshness = Bm25Freshness(client)
        tokenizer = Tokenizer(stem=settings.bm25.stemming)
        for store in stores:
            freshness.mark_dirty(store.shard)  # what the embed task's commit records
            # The maintenance worker's own full build (a merge), as `shardfuse.bm25_rebuild` runs it.
            shard_indexer(settings, store.shard, store=store, freshness=freshness, tokenizer=tokenizer).merge()
        client.close()
    done = time.perf_counter()
    return LoadTimes(chunks=sum(len(p.chunks) for p in prepared), documents=len(prepared),
                     write_s=written - started, hnsw_s=indexed - written, bm25_s=done - indexed)


def _embedded(batch: list[Prepared], settings: Settings) -> list[DocumentChange]:
    embedder = build_embedder(settings.embedder, models_dir=settings.models_dir)
    vectors = embedder.embed_documents([c.indexed_text for p in batch for c in p.chunks])
    out, at = [], 0
    for p in batch:
        n = len(p.chunks)
        out.append(DocumentChange(event=p.event, status=DocStatus.INDEXED, chunks=p.chunks,
                                  embeddings=vectors[at : at + n], line_count=p.line_count, blocks=p.blocks))
        at += n
    return out
