"""What the scale benchmarks share: a corpus of any size made from SciFact, a stack of their own, indexing
a corpus through the real pipeline, distinct queries, and the report format (a table, then one JSON line).

The corpus replicates SciFact's 5,183 abstracts with distinct paths and text: copy ``r`` of a document
carries a last line naming the copy, so no two documents (and no two chunks) are equal and the zone's
repeated-chunk registry never folds one into another. Its term statistics stay SciFact's.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import pytest

from shardfuse.query.evaluation import load_beir
from tests.integration.conftest import Stack, running_stack

if TYPE_CHECKING:
    from shardfuse.pipeline.index.store.vector_index import BuildSettings
    from shardfuse.pipeline.index.store.vector_types import VectorType

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@dataclass(frozen=True)
class Doc:
    path: str
    text: str


def _scifact() -> Any:
    if not (DATA / "scifact").is_dir():
        pytest.skip(f"SciFact is not under {DATA}")
    return load_beir(DATA / "scifact", split="test")


def corpus(n_docs: int) -> list[Doc]:
    """``n_docs`` distinct documents: SciFact's abstracts, copy after copy."""
    base = _scifact().corpus
    docs = []
    for i in range(n_docs):
        copy, doc = divmod(i, len(base))
        source = base[doc]
        text = f"{source.title}\n\n{source.text}\n\nCopy {copy} of SciFact document {source.doc_id}.\n"
        docs.append(Doc(path=f"c{copy:03d}/{source.doc_id}.txt", text=text))
    return docs


def queries(n: int) -> list[str]:
    """``n`` distinct natural-language queries: SciFact's (all splits), then CoSQA's if more are needed."""
    seen: dict[str, None] = {}
    for name in ("scifact", "cosqa"):
        path = DATA / name / "queries.jsonl"
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            text = str(json.loads(line).get("text") or "").strip()
            if text:
                seen.setdefault(text, None)
            if len(seen) >= n:
                return list(seen)
    pytest.skip(f"only {len(seen)} distinct queries under {DATA}")
    raise AssertionError  # unreachable


@contextlib.contextmanager
def bench_stack(*, shards: int, **overrides: str) -> Iterator[Stack]:
    """A stack of its own (hashing embedder, ``shards`` shards); ``overrides`` are SHARDFUSE_* settings."""
    env = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_SHARDS": str(shards),
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "1",
        **overrides,
    }
    with running_stack(env) as stack:
        yield stack


def publish(stack: Stack, zone: str, docs: Sequence[Doc]) -> float:
    """Publish every document (CAS write + event); returns the seconds it took."""
    started = time.perf_counter()
    with stack.publisher() as publisher:
        for doc in docs:
            publisher.write(zone=zone, path=doc.path, data=doc.text.encode("utf-8"))
    return time.perf_counter() - started


def index(stack: Stack, zone: str, docs: Sequence[Doc], *, timeout: float = 1800) -> float:
    """Publish ``docs`` and wait until every one is searchable in both legs; returns the seconds from the
    first publish to searchable."""
    started = time.perf_counter()
    publish(stack, zone, docs)
    stack.wait(timeout=timeout)
    return time.perf_counter() - started


def chunk_count(stack: Stack, zone: str) -> int:
    total = 0
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        for shard in range(stack.settings.shards):
            row = conn.execute(f"SELECT count(*) FROM shard_{shard}.chunks WHERE zone = %s", (zone,)).fetchone()
            total += int(row[0]) if row else 0
    return total


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest-rank on the sorted values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


T = TypeVar("T")


def timed(fn: Callable[[str], T], queries: Sequence[str]) -> tuple[list[float], list[T]]:
    """``fn`` on each query in turn: the seconds each call took, and what each returned."""
    seconds, answers = [], []
    for query in queries:
        started = time.perf_counter()
        answers.append(fn(query))
        seconds.append(time.perf_counter() - started)
    return seconds, answers


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"p50_ms": round(statistics.median(ms), 2), "p99_ms": round(percentile(ms, 99), 2)}


def report(bench: str, header: Sequence[str], rows: Sequence[Sequence[Any]], figures: dict[str, Any]) -> None:
    """Print a table, then, last, one JSON line with the benchmark's figures."""
    cells = [[str(h) for h in header]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print()
    for n, row in enumerate(cells):
        print("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * width for width in widths))
    print(json.dumps({"bench": bench, **figures}, sort_keys=True))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def publish_many(stack: Stack, zone: str, docs: Sequence[Doc], *, threads: int = 8) -> float:
    """:func:`publish` through ``Publisher.write_many`` (CAS writes overlapped on threads); the seconds it took."""
    from shardfuse.pipeline.admin.publisher import Write

    started = time.perf_counter()
    with stack.publisher() as publisher:
        publisher.write_many((Write(zone=zone, path=d.path, data=d.text.encode("utf-8")) for d in docs),
                             threads=threads)
    return time.perf_counter() - started


def bare_copy(stack: Stack, *, source_zone: str, index_present: bool = True) -> tuple[int, float]:
    """The physical limit of a shard write on this machine: ``source_zone``'s chunk rows, read out of the
    pipeline's shards, written into the same shard tables (same DDL, ``shardfuse.pipeline.index.store.schema``) of a new
    database by one bare ``COPY … (FORMAT BINARY)`` per shard, the shards' COPYs in parallel as the pipeline
    writes them. With ``index_present`` the HNSW index is there during the COPY; without, it is dropped
    first and built after (timed too). Returns (rows, seconds of the writes)."""
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from shardfuse.pipeline.index.store.vector_index import BuildSettings

    settings = stack.settings
    dsn = settings.postgres.dsn
    name = f"bare_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    target = dsn.rsplit("/", 1)[0] + f"/{name}"
    build = BuildSettings(memory_mb=settings.vector_index.build_memory_mb,
                          m=settings.vector_index.m, ef_construction=settings.vector_index.ef_construction)
    shards = [_BareShard(shard) for shard in range(settings.shards)]
    rows = _copy_out(dsn, target, shards, zone=source_zone, build=build, index_present=index_present)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(shards)) as pool:  # one thread per shard, as the pipeline writes
        writes = [pool.submit(_copy_in, target, shard, build=build, index_present=index_present) for shard in shards]
    seconds = time.perf_counter() - started
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name}")
    for write in writes:
        write.result()  # a shard's error, raised once the database is gone
    return rows, seconds


@dataclass
class _BareShard:
    """One shard of :func:`bare_copy`: its chunk rows as COPY BINARY bytes, and its embeddings' pgvector type."""

    shard: int
    payload: bytes = b""
    vector_type: VectorType = "vector"


def _copy_out(dsn: str, target: str, shards: list[_BareShard], *, zone: str, build: BuildSettings,
              index_present: bool) -> int:
    """Create the shards' tables in ``target`` (without the HNSW index unless ``index_present``) and read
    ``zone``'s chunk rows of each shard at ``dsn`` into its payload; the number of rows."""
    from shardfuse.pipeline.index.store.schema import ensure_shard_schema, shard_schema
    from shardfuse.pipeline.index.store.vector_index import INDEX_NAME

    with psycopg.connect(dsn) as conn:
        dimensions = embedding_dimensions(conn)
    rows = 0
    with psycopg.connect(dsn) as source, psycopg.connect(target, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for bare in shards:
            schema = shard_schema(bare.shard)
            bare.vector_type = ensure_shard_schema(conn, bare.shard, dimensions=dimensions, build=build)
            if not index_present:
                conn.execute(f'DROP INDEX "{schema}"."{INDEX_NAME}"')
            buffer = bytearray()
            query = f"COPY (SELECT * FROM {schema}.chunks WHERE zone = %s) TO STDOUT (FORMAT BINARY)"
            with source.cursor().copy(query, (zone,)) as copy:
                for block in copy:
                    buffer += block
            bare.payload = bytes(buffer)
            row = source.execute(f"SELECT count(*) FROM {schema}.chunks WHERE zone = %s", (zone,)).fetchone()
            rows += int(row[0]) if row else 0
    return rows


def _copy_in(target: str, bare: _BareShard, *, build: BuildSettings, index_present: bool) -> None:
    """One bare COPY of the shard's payload into ``target``; then, unless ``index_present``, its HNSW index."""
    from shardfuse.pipeline.index.store.schema import shard_schema
    from shardfuse.pipeline.index.store.vector_index import create_index_sql

    schema = shard_schema(bare.shard)
    with psycopg.connect(target) as conn:
        with conn.cursor().copy(f"COPY {schema}.chunks FROM STDIN (FORMAT BINARY)") as copy:
            view = memoryview(bare.payload)
            for start in range(0, len(view), 1 << 20):
                copy.write(view[start:start + (1 << 20)])
        conn.commit()
        if not index_present:
            conn.autocommit = True
            conn.execute(f"SET maintenance_work_mem = '{build.memory_mb}MB'")
            conn.execute(create_index_sql(schema, build, concurrently=False, vector_type=bare.vector_type))


def embedding_dimensions(conn: psycopg.Connection[Any]) -> int:
    """The dimensions of shard 0's ``embedding`` column (the stack's embedder's)."""
    row = conn.execute(
        "SELECT a.atttypmod FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'shard_0' AND c.relname = 'chunks' AND a.attname = 'embedding'"
    ).fetchone()
    assert row is not None, "shard_0 has no chunks table yet"
    return int(row[0])


def wait_searchable(stack: Stack, *, timeout: float = 7200, poll_s: float = 0.2) -> None:
    """Block until everything published is searchable in both legs: the ingest and embed queues hold
    nothing (waiting or in flight), every shard's BM25 generation (with its delta) includes every commit,
    and no shard's HNSW index is deferred. Unlike :meth:`Stack.wait` (``shardfuse wait``), maintenance
    work that is only scheduled (a BM25 merge waiting out its countdown) does not count."""
    from shardfuse.pipeline.index.store.lag_reader import ShardLagReader
    from shardfuse.pipeline.index.store.schema import shard_schema
    from shardfuse.pipeline.index.store.vector_index import is_deferred
    from shardfuse.workers.monitor import broker_client, pending_work
    from shardfuse.workers.names import Queue

    settings = stack.settings
    client = broker_client(settings)
    deadline = time.monotonic() + timeout
    # One reader for every look: a new one each 0.2 s cost PostgreSQL a backend and a password exchange, CPU
    # the ingest being timed then lacked (session 28).
    with psycopg.connect(settings.postgres.dsn, autocommit=True) as conn, ShardLagReader(settings) as lags:
        while time.monotonic() < deadline:
            state = pending_work(settings, client, lags=lags)
            if (not state["pending"][Queue.INGEST.value] and not state["pending"][Queue.EMBED.value]
                    and not state["stale_shards"]
                    and not any(is_deferred(conn, shard_schema(s)) for s in range(settings.shards))):
                return
            time.sleep(poll_s)
    raise AssertionError("not searchable in time")
