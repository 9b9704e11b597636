"""One typed settings object, built once at the entry point and passed down.

Precedence, lowest to highest: the defaults of the sections (which ``config/default.toml`` spells out), the
TOML file given to :func:`load_settings` (else the one ``SHARDFUSE_CONFIG`` names), environment variables
``SHARDFUSE_<KEY>`` with ``__`` between nesting levels (``SHARDFUSE_EMBEDDER__PROVIDER=hashing``), then the
keyword overrides of :func:`load_settings`. Environment wins over the file so that secrets and per-host
ports injected by a deployment always take effect. Nothing here writes the environment: processes the
launcher starts get the settings it resolved as a file (:mod:`shardfuse.pipeline.config.handoff`). Last,
:func:`load_settings` fills in the embedded stack's generated passwords where the settings point at that stack
without one (:mod:`shardfuse.pipeline.config.stack_secrets`).

The sections live in modules of their own (``stores``, ``ingest``, ``embedder``, ``query``, ``workers``,
``logging``); this module re-exports them, so ``from shardfuse.pipeline.config.settings import
WorkerSettings`` keeps working.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from shardfuse.pipeline.config.api import ApiSettings
from shardfuse.pipeline.config.embedder import DEFAULT_MODEL, MODEL_NAME, EmbedderProvider, EmbedderSettings
from shardfuse.pipeline.config.ingest import (
    ChunkingSettings,
    ChunkStrategy,
    ContextSettings,
    EntropySettings,
    IngestSettings,
    LimitSettings,
)
from shardfuse.pipeline.config.logging import LoggingSettings
from shardfuse.pipeline.config.query import (
    BoostSettings,
    ExpansionSettings,
    FusionName,
    QuerySettings,
    RouterSettings,
    ZoneProfile,
)
from shardfuse.pipeline.config.rerank import RerankProvider, RerankSettings
from shardfuse.pipeline.config.stack_ports import with_stack_ports
from shardfuse.pipeline.config.stack_secrets import with_stack_secrets
from shardfuse.pipeline.config.stores import (
    Bm25Settings,
    BrokerSettings,
    CasSettings,
    PostgresSettings,
    VectorIndexSettings,
    VectorStorage,
)
from shardfuse.pipeline.config.watch import WatchSettings
from shardfuse.pipeline.config.workers import (
    DeliverySettings,
    FlowerSettings,
    StackSettings,
    TaskLimits,
    WorkerSettings,
)
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.validation_errors import field_problems

CONFIG_ENV = "SHARDFUSE_CONFIG"

__all__ = [
    "CONFIG_ENV", "DEFAULT_MODEL", "MODEL_NAME", "Bm25Settings", "BoostSettings", "BrokerSettings", "CasSettings",
    "ChunkStrategy", "ChunkingSettings", "ContextSettings", "DeliverySettings", "EmbedderProvider", "EmbedderSettings",
    "EntropySettings", "ExpansionSettings", "FlowerSettings", "FusionName", "IngestSettings", "LimitSettings",
    "LoggingSettings", "PostgresSettings", "QuerySettings", "RerankProvider", "RerankSettings", "RouterSettings",
    "Settings", "StackSettings", "TaskLimits",
    "VectorIndexSettings", "VectorStorage", "WorkerSettings", "ZoneProfile", "config_file_from_env", "load_settings",
    "settings_from_json",
]  # fmt: skip


@dataclass(frozen=True)
class _Sources:
    """Where the settings being built come from besides their keyword values."""

    environment: bool = True
    config_file: Path | None = None


# What load_settings or settings_from_json asked for: a context variable, not a process-wide one, so that
# two threads building settings from different sources never see each other's. Unset, a plain
# ``Settings(...)`` reads the environment and the file SHARDFUSE_CONFIG names.
_SOURCES: ContextVar[_Sources | None] = ContextVar("shardfuse_settings_sources", default=None)


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
    ingest: IngestSettings = IngestSettings()
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
    rerank: RerankSettings = RerankSettings()  # reranking after fusion (pipeline/config/rerank.py); off by default
    api: ApiSettings = ApiSettings()  # the HTTP API (shardfuse api; pipeline/config/api.py)
    workers: WorkerSettings = WorkerSettings()
    delivery: DeliverySettings = DeliverySettings()
    stack: StackSettings = StackSettings()
    flower: FlowerSettings = FlowerSettings()
    logging: LoggingSettings = LoggingSettings()
    watch: WatchSettings = WatchSettings()  # shardfuse watch (pipeline/config/watch.py)
    # Fault tests only (shardfuse.pipeline.core.failpoints): failpoint name -> marker file; empty in production.
    failpoints: dict[str, Path] = {}

    @model_validator(mode="after")
    def _check(self) -> Settings:
        for problem in (self._shard_dsns_problem(), self._time_limits_problem(), self._model_names_problem()):
            if problem:
                raise ValueError(problem)
        return self

    def _shard_dsns_problem(self) -> str | None:
        if self.postgres.shard_dsns and len(self.postgres.shard_dsns) != self.shards:
            return f"postgres.shard_dsns names {len(self.postgres.shard_dsns)} DSNs but shards = {self.shards}"
        return None

    def _time_limits_problem(self) -> str | None:
        longest, delivery = self.workers.longest_hard_s, self.delivery
        if self.broker.visibility_timeout_s <= longest:
            return (f"broker.visibility_timeout_s ({self.broker.visibility_timeout_s}) must exceed the longest "
                    f"task hard limit ({longest}s), or Redis redelivers messages that are still running")
        if delivery.dead_after_s < 2 * delivery.heartbeat_s:
            return (f"delivery.dead_after_s ({delivery.dead_after_s}) must be at least twice "
                    f"delivery.heartbeat_s ({delivery.heartbeat_s}), or a live worker looks dead")
        if self.ingest.document_deadline_s >= self.workers.ingest_limits.soft_s:
            return (f"ingest.document_deadline_s ({self.ingest.document_deadline_s}) must be shorter than the "
                    f"ingest soft time limit ({self.workers.ingest_limits.soft_s}s), or an overrunning document "
                    "takes its whole message down instead of being dead-lettered alone")
        stage_hard = max(self.workers.ingest_limits.hard_s, self.workers.embed_limits.hard_s)
        if delivery.lease_s <= stage_hard:
            return (f"delivery.lease_s ({delivery.lease_s}) must exceed the ingest and embed hard "
                    f"limits ({stage_hard}s), or a lease lapses under a running task")
        return None

    def _model_names_problem(self) -> str | None:
        for name in self.embedders:
            if name == DEFAULT_MODEL or not MODEL_NAME.fullmatch(name):
                return (f"embedders.{name}: a model name is 1-31 lower-case letters, digits or _, starting "
                        f"with a letter, and not {DEFAULT_MODEL!r} (that is [embedder])")
        return None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: keyword values, the environment, the TOML file.
        sources = _SOURCES.get() or _Sources(config_file=config_file_from_env())
        chosen = [init_settings]
        if sources.environment:
            chosen.append(env_settings)
        if sources.config_file is not None:
            chosen.append(TomlConfigSettingsSource(settings_cls, toml_file=sources.config_file))
        return tuple(chosen)

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


def config_file_from_env() -> Path | None:
    """The TOML file ``SHARDFUSE_CONFIG`` names (read, never written), or None."""
    value = os.environ.get(CONFIG_ENV)
    return Path(value) if value else None


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build the settings object: defaults < TOML file < environment < ``overrides``.

    ``config_file`` (the CLI's ``--config``) defaults to the file ``SHARDFUSE_CONFIG`` names. The
    environment is only read: processes started with these settings get them from the launcher
    (:mod:`shardfuse.pipeline.config.handoff`), keyword overrides included.
    """
    named = Path(config_file) if config_file is not None else config_file_from_env()
    path = None
    if named is not None:
        path = named.expanduser().resolve()
        if not path.is_file():
            source = "--config" if config_file is not None else CONFIG_ENV
            raise ConfigurationError(f"config file {path} does not exist (named by {source})")
    token = _SOURCES.set(_Sources(config_file=path))
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid settings: {field_problems(exc, whole='settings')}") from exc
    except ValueError as exc:  # a TOML syntax error
        raise ConfigurationError(f"invalid settings: {exc}") from exc
    finally:
        _SOURCES.reset(token)
    # The ports the embedded stack chose where the user left them at their defaults
    # (shardfuse.pipeline.config.stack_ports), then its generated passwords, where the settings point at it
    # without one.
    return with_stack_secrets(with_stack_ports(settings))


def settings_from_json(text: str) -> Settings:
    """Settings holding exactly the values of the JSON object ``text`` (the defaults for keys it lacks):
    neither the environment nor a TOML file is read. Raises pydantic's ValidationError."""
    token = _SOURCES.set(_Sources(environment=False))
    try:
        return Settings.model_validate_json(text)
    finally:
        _SOURCES.reset(token)
