"""The ``[embedder]`` and ``[embedders.<name>]`` sections of :class:`shardfuse.pipeline.config.settings.Settings`: which
embedding model makes the vectors, and how it is called."""

from __future__ import annotations

import enum
import re
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from shardfuse.pipeline.config.section import Section as _Section

# The embedding model of [embedder]; further models are named by [embedders.<name>] (MODEL_NAME).
DEFAULT_MODEL = "default"
MODEL_NAME = re.compile(r"[a-z][a-z0-9_]{0,30}")


class EmbedderProvider(enum.StrEnum):
    LOCAL = "local"
    HASHING = "hashing"
    OPENAI = "openai"
    VOYAGE = "voyage"


class EmbedderSettings(_Section):
    provider: EmbedderProvider = EmbedderProvider.LOCAL
    model: str = "all-MiniLM-L6-v2"
    dimensions: int = Field(default=384, ge=8, le=16000)
    # Inputs per embedding request (None: the provider's own default, e.g. OpenAI 256, Voyage 128, local 64).
    # Cross-document batching flushes when a batch holds 4 requests' worth of chunks or has waited
    # batch_wait_ms.
    batch_size: int | None = Field(default=None, ge=1)
    batch_wait_ms: int = Field(default=50, ge=0)
    # How the local model runs: "onnx" (ONNX Runtime, graph exported once under <data_dir>/models; about 3×
    # faster per query on CPU, same vectors) or "torch". Without onnxruntime installed, onnx falls back to torch.
    local_runtime: Literal["onnx", "torch"] = "onnx"
    # The local model's weights under ONNX Runtime: "fp32" (the model as published) or "int8" (dynamically
    # quantised once under <data_dir>/models: faster on CPU, vectors within cosine ~0.99 of fp32; it is a model
    # of its own, "local:<model>@int8", so its vectors and cache entries never mix with fp32's: move a zone over
    # with `shardfuse reindex`). int8 needs local_runtime = "onnx" and onnxruntime installed.
    local_precision: Literal["fp32", "int8"] = "fp32"
    # ONNX Runtime threads per forward pass of the local model; 0: the cores this process may use, divided by
    # how many forward passes run at once (the embed pool runs one at a time: pipeline/embed/providers/threads.py).
    local_threads: int = Field(default=0, ge=0, le=256)
    # Remote providers (openai, voyage). The key comes from SHARDFUSE_EMBEDDER__API_KEY; base_url points the
    # SDK at any compatible server (empty: the provider's own).
    api_key: SecretStr = SecretStr("")
    base_url: str = ""
    request_timeout_s: float = Field(default=30.0, gt=0)
    # One input over the model's per-input limit, counted in the model's own tokenizer (all-MiniLM-L6-v2: 256
    # word-pieces with [CLS] and [SEP]): "split" embeds consecutive windows and averages them (token-weighted,
    # normalised); "truncate" embeds its first tokens only (what the local model did silently before issue 22).
    # Either way it is counted (shardfuse_embedding_oversize_chunks_total) and a truncated chunk is shown on its
    # document's row (shardfuse status). With chunking.fit_embedder, only an unbreakable run still gets here.
    oversize_input: Literal["truncate", "split"] = "split"
    # Backpressure: requests in flight per process, and across every embed worker (Redis-backed, per
    # provider and model); 0 per-minute limits mean none. Concurrency adapts (AIMD) below the global cap.
    max_concurrent: int = Field(default=4, ge=1)
    global_max_concurrent: int = Field(default=16, ge=1)
    requests_per_minute: int = Field(default=0, ge=0)
    tokens_per_minute: int = Field(default=0, ge=0)
    # Transient failures (429, 5xx, timeouts, resets) are retried with exponential jitter for at most this long.
    max_retry_s: float = Field(default=120.0, gt=0)
    # The chunk embedding cache (shardfuse.embedding_cache): a chunk text this model embedded before is not sent
    # again. "auto": on, except for the hashing embedder, which makes a vector in less time than the cache's
    # lookup and insert take (docs/performance.md, session 24); "on" / "off" force it.
    cache: Literal["auto", "on", "off"] = "auto"
    # Query embeddings: a per-process LRU of this many entries, backed by Redis for this long (0: no Redis).
    query_cache_entries: int = Field(default=4096, ge=0)
    query_cache_ttl_s: int = Field(default=86400, ge=0)
    # At most this many vectors in Redis (the oldest go first): the broker's Redis is no place for an unbounded
    # cache (docs/operations.md, "Memory budget": about dimensions × 4 + 360 bytes each).
    query_cache_redis_entries: int = Field(default=20_000, ge=0)

    @property
    def uses_cache(self) -> bool:
        """Whether the embed stage asks the chunk embedding cache (``cache``, resolved)."""
        return self.cache == "on" or (self.cache == "auto" and self.provider is not EmbedderProvider.HASHING)

    @model_validator(mode="after")
    def _precision_fits_runtime(self) -> EmbedderSettings:
        if self.local_precision == "int8" and (self.provider != EmbedderProvider.LOCAL or self.local_runtime != "onnx"):
            raise ValueError(
                "embedder.local_precision = \"int8\" quantises the local model under ONNX Runtime: it needs "
                f"embedder.provider = \"local\" and embedder.local_runtime = \"onnx\" (got provider "
                f"{self.provider.value!r}, local_runtime {self.local_runtime!r})"
            )
        return self
