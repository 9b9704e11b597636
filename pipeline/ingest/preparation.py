"""From decoded text to the chunks that get embedded: chunk → filter → contextualize.

1. **Chunk** by the strategy the document's type maps to (:mod:`shardfuse.pipeline.ingest.chunkers`), at a
   budget that lets each chunk and its context fit the embedding model's input
   (:mod:`shardfuse.pipeline.ingest.embedder_fit`, ``chunking.fit_embedder``).
2. **Filter** (when ``entropy.enabled``): exact duplicates, near-empty and boilerplate chunks and chunks
   whose information score falls below the threshold are dropped before any embedding is paid for
   (:mod:`shardfuse.pipeline.ingest.chunk_filter`); the drops are counted by reason. A document never loses every chunk.
3. **Contextualize** (``context.source``): ``headings`` gives every chunk its path/outline/symbol context;
   ``llm`` asks the chat model for each chunk's context and falls back to the headings context, marked for
   backfill, for every chunk whose call failed for good.

:func:`prepare_chunks` is what the ingest stage runs and what ``shardfuse explain-chunks`` shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.core.documents import Chunk, ContextSource
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.providers.model_limits import input_limit
from shardfuse.pipeline.ingest.chunk_filter import ChunkVerdict, DropReason, FilterSettings, drop_counts, filter_chunks
from shardfuse.pipeline.ingest.chunkers import ChunkBudget, chunk_document, renumbered
from shardfuse.pipeline.ingest.context.headings import with_headings_context
from shardfuse.pipeline.ingest.context.llm import ContextOutcome, ContextRequest
from shardfuse.pipeline.ingest.embedder_fit import fitted_chunks


class ChunkRegistry(Protocol):
    def repeated(self, zone: str, path: str, chunk_hashes: Sequence[str]) -> set[str]: ...


class Contextualizer(Protocol):
    """The LLM context source (:class:`shardfuse.pipeline.ingest.context.llm.LlmContextualizer`)."""

    def contexts(self, document: str, requests: Sequence[ContextRequest], *, doc_hash: str) -> list[ContextOutcome]: ...


@dataclass(frozen=True, slots=True)
class PreparedChunks:
    """The chunks to embed; every chunk the strategy made with the filter's verdict on it (in the same
    order); the drops counted by reason; and how many chunks wait for an LLM context (backfill)."""

    chunks: tuple[Chunk, ...]
    candidates: tuple[Chunk, ...]
    verdicts: tuple[ChunkVerdict, ...] | None
    dropped: dict[str, int] = field(default_factory=dict)
    backfill: int = 0


def prepare_chunks(
    text: str,
    *,
    path: str,
    doc_hash: str,
    settings: Settings,
    counter: TokenCounter,
    contextualizer: Contextualizer | None = None,
    registry: ChunkRegistry | None = None,
    zone: str = "",
) -> PreparedChunks:
    """Chunk, filter and contextualize one decoded document (see the module docstring). With the filter on
    and a ``registry``, a chunk another document of ``zone`` indexed first is dropped as ``repeated``."""
    chunking = settings.chunking
    budget = ChunkBudget(max_tokens=chunking.max_tokens, overlap_tokens=chunking.overlap_tokens)
    limit = input_limit(settings.embedder) if chunking.fit_embedder else None
    if limit is not None:  # chunk + context within the model's input (pipeline/ingest/embedder_fit.py)
        candidates = fitted_chunks(text, path=path, counter=counter, budget=budget, strategies=chunking.strategies,
                                   limit=limit, context_source=settings.context.source)
    else:
        candidates = chunk_document(text, path=path, counter=counter, budget=budget, strategies=chunking.strategies)
    checkpoint("chunking")
    verdicts: list[ChunkVerdict] | None = None
    kept = candidates
    if settings.entropy.enabled and candidates:
        verdicts = filter_chunks([c.text for c in candidates], counter=counter, settings=filter_settings(settings))
        if registry is not None:
            verdicts = _drop_repeated(candidates, verdicts, registry.repeated(zone, path, [
                c.chunk_hash for c, v in zip(candidates, verdicts, strict=True) if v.kept]))
        kept = renumbered([c for c, v in zip(candidates, verdicts, strict=True) if v.kept])
        checkpoint("filtering its chunks")
    source = settings.context.source
    backfill = 0
    if source != "none":
        kept = with_headings_context(path, kept)
    if source == "llm" and kept:
        if contextualizer is None:
            kept = [dataclasses.replace(c, context_source=ContextSource.BACKFILL) for c in kept]
            backfill = len(kept)
        else:
            kept, backfill = _with_llm_context(text, kept, doc_hash=doc_hash, contextualizer=contextualizer)
    return PreparedChunks(
        chunks=tuple(kept),
        candidates=tuple(candidates),
        verdicts=None if verdicts is None else tuple(verdicts),
        dropped=drop_counts(verdicts) if verdicts is not None else {},
        backfill=backfill,
    )


def _drop_repeated(
    candidates: Sequence[Chunk], verdicts: Sequence[ChunkVerdict], repeated: set[str]
) -> list[ChunkVerdict]:
    """Kept chunks whose text another document holds, dropped as repeated; a document keeps at least its
    first kept chunk (never every chunk dropped)."""
    out = list(verdicts)
    kept = [i for i, v in enumerate(out) if v.kept]
    doomed = [i for i in kept if candidates[i].chunk_hash in repeated]
    if len(doomed) == len(kept):
        doomed = doomed[1:]
    for i in doomed:
        out[i] = dataclasses.replace(out[i], kept=False, reason=DropReason.REPEATED)
    return out


def filter_settings(settings: Settings) -> FilterSettings:
    entropy = settings.entropy
    return FilterSettings(alpha=entropy.alpha, threshold=entropy.threshold, min_tokens=entropy.min_tokens,
                          min_entropy_bits=entropy.min_entropy_bits)


def _with_llm_context(
    text: str, chunks: Sequence[Chunk], *, doc_hash: str, contextualizer: Contextualizer
) -> tuple[list[Chunk], int]:
    outcomes = contextualizer.contexts(
        text, [ContextRequest(chunk_hash=c.chunk_hash, chunk_text=c.text) for c in chunks], doc_hash=doc_hash
    )
    out: list[Chunk] = []
    backfill = 0
    for chunk, outcome in zip(chunks, outcomes, strict=True):
        if outcome.context:
            out.append(dataclasses.replace(chunk, context=outcome.context, context_source=ContextSource.LLM))
        else:  # keeps its headings context until backfill-context gets an LLM one
            out.append(dataclasses.replace(chunk, context_source=ContextSource.BACKFILL))
            backfill += 1
    return out, backfill
