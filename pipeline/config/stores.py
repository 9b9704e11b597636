"""Where shardfuse keeps things: the broker, PostgreSQL, the CAS, and each shard's vector and BM25 indexes
(sections of :class:`shardfuse.pipeline.config.settings.Settings`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from shardfuse.pipeline.config.cas_location import FileLocation, S3Location, S3Settings, parse_cas_url
from shardfuse.pipeline.config.redaction import redact_dsn, redact_url, url_problem
from shardfuse.pipeline.config.section import Section as _Section


class BrokerSettings(_Section):
    url: str = "redis://127.0.0.1:16379/0"
    result_backend: str = "redis://127.0.0.1:16379/1"
    # Must exceed the longest task's hard time limit, or Redis redelivers a message that is still running.
    visibility_timeout_s: int = 3600
    # Write events a publisher packs into one ingest message; the ingest stage passes the documents of a
    # message on to the embed stage as one message too. Fewer, larger messages cost the broker and the
    # workers less per document; 1 publishes every event on its own.
    events_per_message: int = Field(default=16, ge=1, le=1000)
    # The largest item a worker takes off a queue; a larger one is set aside unread in shardfuse:unreadable
    # (shardfuse.workers.broker.envelope), since decoding it could exhaust the worker's memory at every start.
    # An embed message carries up to events_per_message documents' chunk texts: raise this with
    # limits.max_file_bytes if documents near that limit arrive many to a message.
    max_message_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # Publishers refuse new events (StoreUnavailableError; they keep them) once the broker's used memory passes
    # this share of its maxmemory, leaving the rest to the workers, which must still receive to drain it
    # (shardfuse.workers.broker.headroom). 1: never refuse early.
    publish_high_water: float = Field(default=0.85, gt=0, le=1)

    @field_validator("url", "result_backend")
    @classmethod
    def _connectable(cls, url: str) -> str:
        problem = url_problem(url)  # else redis-py fails at the first connection, with a traceback
        if problem:
            raise ValueError(problem)
        return url

    @property
    def display_url(self) -> str:
        """``url`` fit to print: its password masked."""
        return redact_url(self.url)

    def __repr_args__(self) -> Any:  # the URLs' passwords never reach a repr, str or log line
        return [(k, redact_url(v) if k in ("url", "result_backend") else v) for k, v in super().__repr_args__()]


class PostgresSettings(_Section):
    dsn: str = "postgresql://postgres@127.0.0.1:15432/shardfuse"
    # One DSN per shard; empty means every shard is a schema in ``dsn``.
    shard_dsns: list[str] = Field(default_factory=list)
    pool_min_size: int = 1
    pool_max_size: int = 8

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:  # the DSNs' passwords never reach a repr
        for key, value in super().__repr_args__():
            if key == "dsn":
                yield key, redact_dsn(value)
            elif key == "shard_dsns":
                yield key, [redact_dsn(dsn) for dsn in value]
            else:
                yield key, value


class CasSettings(_Section):
    """Where content lives (:mod:`shardfuse.pipeline.config.cas_location`; opened by
    :func:`shardfuse.pipeline.storage.opening.open_content_store`)."""

    # "" is the folder ``root``; else file:///absolute/path or s3://bucket[/prefix] (then [cas.s3] applies).
    url: str = ""
    # The folder of url = "": relative paths are taken under ``data_dir``.
    root: Path = Path("cas")
    s3: S3Settings = S3Settings()

    @field_validator("url")
    @classmethod
    def _known_url(cls, url: str) -> str:
        parse_cas_url(url)  # a bad URL fails at load, with the forms it may take
        return url

    @property
    def location(self) -> FileLocation | S3Location | None:
        """``url`` parsed; None for the folder ``root``."""
        return parse_cas_url(self.url)


VectorStorage = Literal["auto", "vector", "halfvec"]


class VectorIndexSettings(_Section):
    """Each shard's HNSW index (see :mod:`shardfuse.pipeline.index.store.vector_index`)."""

    # The type of new shards' embedding columns: "auto" is halfvec (2 bytes a dimension) where the server's
    # pgvector is 0.7 or newer, else vector; "halfvec" refuses an older server. A shard keeps its type.
    storage: VectorStorage = "auto"
    # Graph parameters of new indexes (pgvector's defaults).
    m: int = Field(default=16, ge=2, le=100)
    ef_construction: int = Field(default=64, ge=4, le=1000)
    # Bulk loads: a load of at least this many rows coming at a shard, and large next to it, is written
    # without the index, which is built once the queues are empty (0 never defers).
    defer_min_rows: int = Field(default=2000, ge=0)
    # The deferred build: memory (maintenance_work_mem), parallel workers (0: one less than this machine's
    # cores, at least 1), and how often a waiting build checks whether the queues are empty (it starts at the
    # first check that finds them so; every second of it is a second the load's end waits for its indexes).
    build_memory_mb: int = Field(default=512, ge=64)
    build_parallel_workers: int = Field(default=0, ge=0)
    build_debounce_s: float = Field(default=1.0, ge=0)


class Bm25Settings(_Section):
    # This node's local copy of every shard's BM25 index (a cache: the indexes are published in each shard's
    # PostgreSQL schema, and a node with an empty directory fetches them). Relative paths are under ``data_dir``.
    dir: Path = Path("bm25")
    # How often a query worker asks whether a new generation or delta was published (and fetches it).
    follow_interval_s: float = Field(default=0.1, gt=0, le=60)
    k1: float = 1.5
    b: float = 0.75
    # English Snowball stemming of BM25 tokens (index and query alike; changing it rebuilds the indexes).
    stemming: bool = True
    rebuild_debounce_s: float = Field(default=1.0, ge=0)
    keep_generations: int = Field(default=2, ge=1)
    # Fresh writes go to a delta segment this long after their commit (pipeline/index/lexical/updates.py); the
    # delta is merged into a new generation (a full rebuild, paced by ``rebuild_debounce_s``) once it holds
    # more than ``delta_max_chunks`` chunks (or a quarter of the generation's) or the generation is older
    # than ``merge_after_s``.
    delta_debounce_s: float = Field(default=0.1, ge=0)
    delta_max_chunks: int = Field(default=20_000, ge=1)
    merge_after_s: float = Field(default=3600.0, gt=0)
