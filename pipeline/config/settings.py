"""One typed settings object, built once at the entry point and passed down.

Precedence, lowest to highest: the defaults below (which ``config/default.toml`` spells out), the TOML
file named by ``--config FILE`` or ``SHARDFUSE_CONFIG``, then environment variables ``SHARDFUSE_<KEY>``
with ``__`` between nesting levels (``SHARDFUSE_EMBEDDER__PROVIDER=hashing``). Environment wins so that
secrets and per-host ports injected by a deployment always take effect.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from shardfuse.pipeline.config.embedder import DEFAULT_MODEL, MODEL_NAME, EmbedderProvider, EmbedderSettings
from shardfuse.pipeline.config.logging import LoggingSettings
from shardfuse.pipeline.config.query import (
    BoostSettings,
    ExpansionSettings,
    FusionName,
    QuerySettings,
    RouterSettings,
    ZoneProfile,
)
from shardfuse.pipeline.config.redaction import redact_dsn, redact_url
from shardfuse.pipeline.config.section import Section as _Section
from shardfuse.pipeline.core.errors import ConfigurationError

CONFIG_ENV = "SHARDFUSE_CONFIG"



__all__ = [
    "CONFIG_ENV", "DEFAULT_MODEL", "MODEL_NAME", "BoostSettings", "BrokerSettings", "CasSettings", "ChunkingSettings",
    "ContextSettings", "LoggingSettings",
    "DeliverySettings", "EmbedderProvider", "EmbedderSettings", "EntropySettings", "ExpansionSettings",
    "FlowerSettings", "FusionName", "LimitSettings", "PostgresSettings", "QuerySettings", "RouterSettings", "Settings",
    "StackSettings", "TaskLimits", "VectorIndexSettings", "WorkerSettings", "ZoneProfile", "load_settings",
]  # fmt: skip


class BrokerSettings(_Section):
    url: str = "redis://127.0.0.1:16379/0"
    result_backend: str = "redis://127.0.0.1:16379/1"
    # Must exceed the longest task's hard time limit, or Redis redelivers a message that is still running.
    visibility_timeout_s: int = 3600
    # Write events a publisher packs into one ingest message; the ingest stage passes the documents of a
    # message on to the embed stage as one message too. Fewer, larger messages cost the broker and the
    # workers less per document; 1 publishes every event on its own.
    events_per_message: int = Field(default=16, ge=1, le=1000)

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

    def __repr_args__(self) -> Any:  # the DSNs' passwords never reach a repr, str or log line
        for key, value in super().__repr_args__():
            if key == "dsn":
                yield key, redact_dsn(value)
            elif key == "shard_dsns":
                yield key, [redact_dsn(dsn) for dsn in value]
            else:
                yield key, value


class CasSettings(_Section):
    # Relative paths are taken under ``data_dir``.
    root: Path = Path("cas")


class LimitSettings(_Section):
    max_file_bytes: int = 10 * 1024 * 1024


ChunkStrategy = Literal["fixed", "overlapping", "semantic", "code"]
_DEFAULT_STRATEGIES: dict[str, ChunkStrategy] = {
    ".md": "semantic", ".markdown": "semantic", ".mdx": "semantic", ".rst": "semantic", ".html": "semantic",
    ".htm": "semantic", ".txt": "semantic", "code": "code", "*": "overlapping",
}  # fmt: skip


class ChunkingSettings(_Section):
    encoding: str = "cl100k_base"
    max_tokens: int = Field(default=512, ge=16)
    overlap_tokens: int = Field(default=64, ge=0)
    # Strategy per document type (pipeline/ingest/chunkers): a file extension, "code" (any source language the
    # symbol extractor knows) or "*" (everything else) → fixed | overlapping | semantic | code.
    strategies: dict[str, ChunkStrategy] = Field(default_factory=lambda: dict(_DEFAULT_STRATEGIES))

    @model_validator(mode="after")
    def _overlap_fits(self) -> ChunkingSettings:
        if self.overlap_tokens >= self.max_tokens:
            raise ValueError("chunking.overlap_tokens must be smaller than chunking.max_tokens")
        return self


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
    # cores, at least 1), and how long the queues must stay empty before it starts.
    build_memory_mb: int = Field(default=512, ge=64)
    build_parallel_workers: int = Field(default=0, ge=0)
    build_debounce_s: float = Field(default=5.0, ge=0)


class Bm25Settings(_Section):
    # Relative paths are taken under ``data_dir``.
    dir: Path = Path("bm25")
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


class EntropySettings(_Section):
    """Entropy-aware filtering of low-information chunks before embedding (pipeline/ingest/chunk_filter.py). Off by
    default. score = alpha · entity novelty + (1 − alpha) · semantic novelty; below ``threshold`` a chunk
    is dropped, as are exact duplicates within a document, chunks of fewer than ``min_tokens`` content
    tokens and chunks whose token entropy is below ``min_entropy_bits``."""

    enabled: bool = False
    alpha: float = Field(default=0.5, ge=0, le=1)
    threshold: float = Field(default=0.35, ge=0, le=1)
    min_tokens: int = Field(default=8, ge=0)
    min_entropy_bits: float = Field(default=2.5, ge=0)


class ContextSettings(_Section):
    """The situating context embedded and indexed with each chunk (pipeline/ingest/context).

    ``headings`` (default): path, outline and symbol, free and deterministic. ``llm``: an OpenAI-compatible
    chat model writes 50–100 tokens per chunk from the document (truncated to ``document_tokens``); a chunk
    whose call fails for good, or comes after ``run_token_budget`` tokens were spent by this worker
    process (0: no budget), gets its headings context and a backfill mark (``shardfuse backfill-context``).
    ``none``: the chunk alone.
    """

    source: Literal["none", "headings", "llm"] = "headings"
    base_url: str = "https://api.openai.com/v1"
    api_key: SecretStr = SecretStr("")
    model: str = "gpt-4o-mini"
    request_timeout_s: float = Field(default=30.0, gt=0)
    max_retry_s: float = Field(default=60.0, ge=0)
    max_concurrent: int = Field(default=4, ge=1)
    global_max_concurrent: int = Field(default=16, ge=1)  # chat requests in flight across every worker
    document_tokens: int = Field(default=6000, ge=256)
    run_token_budget: int = Field(default=0, ge=0)


class TaskLimits(_Section):
    soft_s: int
    hard_s: int


class WorkerSettings(_Section):
    ingest_concurrency: int = 2
    embed_concurrency: int = 8
    maintenance_concurrency: int = 1
    query_concurrency: int = 4
    max_retries: int = 5
    ingest_limits: TaskLimits = TaskLimits(soft_s=120, hard_s=150)
    embed_limits: TaskLimits = TaskLimits(soft_s=300, hard_s=360)
    maintenance_limits: TaskLimits = TaskLimits(soft_s=900, hard_s=960)
    query_limits: TaskLimits = TaskLimits(soft_s=30, hard_s=35)


class DeliverySettings(_Section):
    """Document leases and dead-worker release (:mod:`shardfuse.pipeline.coordination.leases`,
    :mod:`shardfuse.pipeline.coordination.liveness`, :mod:`shardfuse.workers.broker.redelivery`)."""

    heartbeat_s: float = Field(default=3.0, gt=0)  # each worker process says it is alive this often
    # Silent this long: dead. Its document leases may be taken over and the messages it held are put back
    # on their queues (without waiting for broker.visibility_timeout_s).
    dead_after_s: float = Field(default=20.0, gt=0)
    # Bounds a lease whose holder keeps beating but never gives it back; must outlast the task hard limits.
    lease_s: float = Field(default=900.0, gt=0)
    busy_retry_s: float = Field(default=2.0, gt=0)  # a document another live worker holds: try again after


class StackSettings(_Section):
    """The embedded single-machine stack started by ``shardfuse up``.

    Redis and PostgreSQL listen where ``broker.url`` and ``postgres.dsn`` point (loopback only), so each
    address is configured exactly once.
    """

    flower_port: int = 15555


class FlowerSettings(_Section):
    user: str = "shardfuse"
    password: SecretStr = SecretStr("shardfuse")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SHARDFUSE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    data_dir: Path = Path("~/.shardfuse")
    shards: int = Field(default=2, ge=1, le=1024)
    broker: BrokerSettings = BrokerSettings()
    postgres: PostgresSettings = PostgresSettings()
    cas: CasSettings = CasSettings()
    limits: LimitSettings = LimitSettings()
    chunking: ChunkingSettings = ChunkingSettings()
    entropy: EntropySettings = EntropySettings()
    context: ContextSettings = ContextSettings()
    embedder: EmbedderSettings = EmbedderSettings()
    # Further embedding models, by name, that a zone can be reindexed to and switched over to
    # (``shardfuse reindex``): each a whole [embedder] table. Their vectors live in a column of their own in
    # every shard (``embedding_<name>``); ``[embedder]`` is the model named "default".
    embedders: dict[str, EmbedderSettings] = {}
    vector_index: VectorIndexSettings = VectorIndexSettings()
    bm25: Bm25Settings = Bm25Settings()
    query: QuerySettings = QuerySettings()
    workers: WorkerSettings = WorkerSettings()
    delivery: DeliverySettings = DeliverySettings()
    stack: StackSettings = StackSettings()
    flower: FlowerSettings = FlowerSettings()
    logging: LoggingSettings = LoggingSettings()

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.postgres.shard_dsns and len(self.postgres.shard_dsns) != self.shards:
            raise ValueError(
                f"postgres.shard_dsns names {len(self.postgres.shard_dsns)} DSNs but shards = {self.shards}"
            )
        longest = max(
            lim.hard_s
            for lim in (
                self.workers.ingest_limits,
                self.workers.embed_limits,
                self.workers.maintenance_limits,
                self.workers.query_limits,
            )
        )
        if self.broker.visibility_timeout_s <= longest:
            raise ValueError(
                f"broker.visibility_timeout_s ({self.broker.visibility_timeout_s}) must exceed the longest "
                f"task hard limit ({longest}s), or Redis redelivers messages that are still running"
            )
        for name in self.embedders:
            if name == DEFAULT_MODEL or not MODEL_NAME.fullmatch(name):
                raise ValueError(f"embedders.{name}: a model name is 1-31 lower-case letters, digits or _, starting "
                                 f"with a letter, and not {DEFAULT_MODEL!r} (that is [embedder])")
        delivery = self.delivery
        if delivery.dead_after_s < 2 * delivery.heartbeat_s:
            raise ValueError(f"delivery.dead_after_s ({delivery.dead_after_s}) must be at least twice "
                             f"delivery.heartbeat_s ({delivery.heartbeat_s}), or a live worker looks dead")
        stage_hard = max(self.workers.ingest_limits.hard_s, self.workers.embed_limits.hard_s)
        if delivery.lease_s <= stage_hard:
            raise ValueError(f"delivery.lease_s ({delivery.lease_s}) must exceed the ingest and embed hard "
                             f"limits ({stage_hard}s), or a lease lapses under a running task")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_ENV)
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)

    # -- derived paths -------------------------------------------------------------------------------
    @property
    def data_path(self) -> Path:
        return self.data_dir.expanduser().resolve()

    def _under_data(self, path: Path) -> Path:
        path = path.expanduser()
        return path if path.is_absolute() else self.data_path / path

    @property
    def cas_root(self) -> Path:
        return self._under_data(self.cas.root)

    @property
    def bm25_root(self) -> Path:
        return self._under_data(self.bm25.dir)

    @property
    def models_dir(self) -> Path:
        """Files derived from embedding models (ONNX exports)."""
        return self.data_path / "models"

    def embedder_for(self, model: str) -> EmbedderSettings:
        """The settings of the embedding model ``model`` ("default" is [embedder]); ConfigurationError when
        this process does not know it."""
        if model == DEFAULT_MODEL:
            return self.embedder
        try:
            return self.embedders[model]
        except KeyError:
            known = ", ".join([DEFAULT_MODEL, *sorted(self.embedders)])
            raise ConfigurationError(f"embedding model {model!r} is not configured here (known: {known}); "
                                     f"declare it as [embedders.{model}] in every worker's settings") from None

    def shard_dsn(self, shard: int) -> str:
        return self.postgres.shard_dsns[shard] if self.postgres.shard_dsns else self.postgres.dsn


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build the settings object: defaults < TOML file < environment < ``overrides``.

    ``config_file`` (the CLI's ``--config``) is exported as ``SHARDFUSE_CONFIG`` so that processes this one
    starts (workers, Flower) read the same file.
    """
    if config_file is not None:
        path = Path(config_file).expanduser().resolve()
        if not path.is_file():
            raise ConfigurationError(f"config file {path} does not exist")
        os.environ[CONFIG_ENV] = str(path)
    try:
        return Settings(**overrides)
    except ValueError as exc:
        raise ConfigurationError(f"invalid settings: {exc}") from exc
