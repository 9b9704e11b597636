"""How much one input of the configured embedding model may hold, counted in that model's own tokenizer.

The ingest stage sizes chunks with it (``chunking.fit_embedder``) without loading the model: a local
model's limit comes from the files in its folder (``tokenizer.json``, ``sentence_bert_config.json``), a
remote one's from the provider's documented per-input limit and counter. The embed stage gets the same
limit from the embedder itself (its ``limits`` and ``counter``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from shardfuse.pipeline.config.embedder import EmbedderProvider, EmbedderSettings
from shardfuse.pipeline.embed.providers.hf_tokens import HuggingFaceCounter, max_seq_length
from shardfuse.pipeline.embed.providers.input_limits import (
    OPENAI_LIMITS,
    TokenCounting,
    openai_counter,
    voyage_counter,
    voyage_limits,
)
from shardfuse.pipeline.embed.providers.local import model_source

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InputLimit:
    """At most ``max_tokens`` tokens per input, as ``counter`` counts them (special tokens included)."""

    counter: TokenCounting
    max_tokens: int


def input_limit(settings: EmbedderSettings) -> InputLimit | None:
    """The per-input limit of the model ``settings`` name; None for the hashing embedder (no limit) and for
    a local model whose tokenizer is not on disk (the embed stage still fits and counts its inputs)."""
    return _input_limit(settings.provider, settings.model)


# Read once per process and model (a tokenizer file is a few MB to parse), like tiktoken's encodings; bounded.
@functools.lru_cache(maxsize=8)
def _input_limit(provider: EmbedderProvider, model: str) -> InputLimit | None:
    if provider == EmbedderProvider.OPENAI:
        return InputLimit(openai_counter(model), OPENAI_LIMITS.max_tokens_per_input)
    if provider == EmbedderProvider.VOYAGE:
        return InputLimit(voyage_counter(model), voyage_limits(model).max_tokens_per_input)
    if provider == EmbedderProvider.LOCAL:
        return _local_limit(model)
    return None


def _local_limit(model: str) -> InputLimit | None:
    folder = _model_folder(model_source(model))
    tokenizer = folder / "tokenizer.json" if folder is not None else None
    limit = max_seq_length(folder) if folder is not None else None
    if tokenizer is None or not tokenizer.is_file() or limit is None:
        log.warning("no tokenizer.json and input limit on disk for embedding model %r: chunks are not sized to "
                    "it at ingest (the embed stage still fits every input and counts what it cuts)", model)
        return None
    try:
        counter = HuggingFaceCounter.from_file(tokenizer, name=model)
    except ImportError:
        log.warning("the tokenizers package is missing: chunks are not sized to embedding model %r at ingest", model)
        return None
    return InputLimit(counter, limit)


def _model_folder(source: str) -> Path | None:
    """The model's folder: ``source`` itself, or its snapshot in the Hugging Face cache (never downloaded)."""
    if Path(source).is_dir():
        return Path(source)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, local_files_only=True))
    except Exception:  # noqa: BLE001 - not installed, not cached, or not a hub id: no folder to read
        return None
