"""How documents become chunks: size limits, chunking, the situating context and the entropy filter
(sections of :class:`shardfuse.pipeline.config.settings.Settings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from shardfuse.pipeline.config.section import Section as _Section


class LimitSettings(_Section):
    max_file_bytes: int = 10 * 1024 * 1024


ChunkStrategy = Literal["fixed", "overlapping", "semantic", "code"]
_DEFAULT_STRATEGIES: dict[str, ChunkStrategy] = {
    ".md": "semantic", ".markdown": "semantic", ".mdx": "semantic", ".rst": "semantic", ".html": "semantic",
    ".htm": "semantic", ".txt": "semantic", "code": "code", "*": "semantic",
}  # fmt: skip


class ChunkingSettings(_Section):
    encoding: str = "cl100k_base"
    # The folder holding the encoding's BPE file (cl100k_base.tiktoken, or tiktoken's cache name for it): read from
    # disk, never downloaded. Unset: the checkout's .cache/tiktoken (which `make install` fills), else tiktoken's
    # own cache ($TIKTOKEN_CACHE_DIR) or a download (shardfuse.pipeline.core.bpe_files).
    bpe_dir: Path | None = None
    max_tokens: int = Field(default=512, ge=16)
    overlap_tokens: int = Field(default=64, ge=0)
    # Shrink a document's budget until each chunk with its context fits the embedding model's input, counted
    # in the model's own tokenizer (all-MiniLM-L6-v2: 256 word-pieces; pipeline/ingest/embedder_fit.py).
    # false: chunks follow max_tokens alone, and embedder.oversize_input handles those over the limit.
    fit_embedder: bool = True
    # Strategy per document type (pipeline/ingest/chunkers): a file extension, "code" (any source language the
    # symbol extractor knows) or "*" (everything else) → fixed | overlapping | semantic | code.
    strategies: dict[str, ChunkStrategy] = Field(default_factory=lambda: dict(_DEFAULT_STRATEGIES))

    @model_validator(mode="after")
    def _overlap_fits(self) -> ChunkingSettings:
        if self.overlap_tokens >= self.max_tokens:
            raise ValueError("chunking.overlap_tokens must be smaller than chunking.max_tokens")
        return self


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
    # The chunk registry (repeated chunks across a zone's documents) keeps at most this many chunk hashes per
    # zone in Redis; past it, new chunks are not claimed (so not recognised as repeats later): about 135 bytes
    # each (docs/operations.md, "Memory budget").
    registry_max_chunks: int = Field(default=1_000_000, ge=0)


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


class IngestSettings(_Section):
    """How long the ingest stage may work on one document (pipeline/ingest/stage.py, message.py).

    ``document_deadline_s``: the CAS read, decoding, chunking, filtering and context of one document run
    against this deadline; a document that overruns it is dead-lettered with its reason
    (``DeadlineExceededError``) while the other documents of its message complete. Keep it well under the
    ingest task's soft time limit (``workers.ingest_limits.soft_s``, checked at start-up).
    """

    document_deadline_s: float = Field(default=60.0, gt=0)
