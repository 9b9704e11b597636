"""Chunk budgets that follow the embedding model's input limit (``chunking.fit_embedder``).

Chunkers count in ``chunking.encoding`` (cl100k); the embedding model counts in its own tokenizer and
reads a chunk *with its context* in front of it. all-MiniLM-L6-v2 reads 256 word-pieces, and a 512-token
cl100k chunk of English is about 540 of them: without this, most of such a chunk never reaches its vector.

So a document is chunked at ``chunking.max_tokens``; if any chunk plus its context is over the model's
limit, the whole document is chunked again at the cl100k budget under which the worst of them would fit
(its own ratio of model tokens to cl100k tokens, with a margin), at most :data:`MAX_ROUNDS` times. One
budget per document keeps its chunks alike (a section is not cut into one big and many small pieces). A
chunk that still does not fit (a single unbreakable run) is fitted and counted by the embed stage
(``embedder.oversize_input``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.providers.input_limits import TokenCounting
from shardfuse.pipeline.embed.providers.model_limits import InputLimit
from shardfuse.pipeline.ingest.chunkers import ChunkBudget, chunk_document
from shardfuse.pipeline.ingest.context.headings import with_headings_context

MAX_ROUNDS = 3
# The budget aims this far under the limit: a chunk cut at other places has a slightly different ratio.
MARGIN = 0.95
# Never below this many cl100k tokens a chunk: a chunk that small would be all context.
MIN_TOKENS = 32
# What an LLM-written context may take of the model's input (the prompt asks for 50–100 tokens).
LLM_CONTEXT_TOKENS = 160


def fitted_chunks(
    text: str,
    *,
    path: str,
    counter: TokenCounter,
    budget: ChunkBudget,
    strategies: Mapping[str, str],
    limit: InputLimit,
    context_source: str,
) -> list[Chunk]:
    """The document's chunks, each (with its context) within ``limit`` where a budget can achieve it."""
    chunks = chunk_document(text, path=path, counter=counter, budget=budget, strategies=strategies)
    for _ in range(MAX_ROUNDS):
        target = fitting_budget(chunks, path=path, limit=limit, context_source=context_source)
        if target is None or target >= budget.max_tokens:
            break
        overlap = budget.overlap_tokens * target // budget.max_tokens
        budget = ChunkBudget(max_tokens=target, overlap_tokens=overlap)
        chunks = chunk_document(text, path=path, counter=counter, budget=budget, strategies=strategies)
    return chunks


def fitting_budget(chunks: Sequence[Chunk], *, path: str, limit: InputLimit, context_source: str) -> int | None:
    """The cl100k budget under which every chunk over ``limit`` would fit, or None when all fit."""
    bodies = _counts(limit.counter, [c.text for c in chunks])
    contexts = _context_tokens(chunks, path=path, limit=limit, context_source=context_source)
    target: int | None = None
    for chunk, body, context in zip(chunks, bodies, contexts, strict=True):
        room = limit.max_tokens - context
        if body <= room:
            continue
        fits = math.floor(chunk.token_count * max(room, 1) / body * MARGIN)
        target = fits if target is None else min(target, fits)
    return None if target is None else max(MIN_TOKENS, target)


def _context_tokens(chunks: Sequence[Chunk], *, path: str, limit: InputLimit, context_source: str) -> list[int]:
    """The model tokens each chunk's context adds in front of it (``Chunk.indexed_text`` joins them with a
    blank line); the special tokens an empty input counts are the body's, not the context's."""
    if context_source == "none":
        return [0] * len(chunks)
    floor = LLM_CONTEXT_TOKENS if context_source == "llm" else 0  # an LLM context, or headings if it fails
    empty = limit.counter.count("")
    contexts = _counts(limit.counter, [c.context + "\n\n" for c in with_headings_context(path, chunks)])
    return [max(floor, n - empty) for n in contexts]


def _counts(counter: TokenCounting, texts: list[str]) -> list[int]:
    """Each text's count, in one batch where the counter can (a Hugging Face tokenizer encodes in Rust)."""
    many = getattr(counter, "count_many", None)
    return list(many(texts)) if many is not None else [counter.count(t) for t in texts]
