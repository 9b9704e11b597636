"""The LLM contextualizer ``context`` settings describe, under the same kind of backpressure as embeddings."""

from __future__ import annotations

from typing import Any

from shardfuse.pipeline.config.settings import ContextSettings
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.limiters.backpressure import LEASE_MARGIN_S, AdaptiveLimit, Backpressure, GlobalLimiter
from shardfuse.pipeline.ingest.context.llm import LlmContextualizer, RunBudget

# The global limiter's key prefix: chat quotas are counted apart from the embedding models'.
CHAT_PROVIDER = "chat"


def build_contextualizer(
    settings: ContextSettings, *, counter: TokenCounter, cache: Any, redis: Any
) -> LlmContextualizer:
    """Requests hold a per-process AIMD slot (``max_concurrent``) and a Redis-backed global lease per chat
    model (``global_max_concurrent`` across every worker); the run budget is this process's."""
    limiter = GlobalLimiter(
        redis,
        provider=CHAT_PROVIDER,
        model=settings.model,
        max_concurrent=settings.global_max_concurrent,
        lease_ttl_s=settings.request_timeout_s + LEASE_MARGIN_S,
    )
    return LlmContextualizer(
        model=settings.model,
        api_key=settings.api_key,
        base_url=settings.base_url,
        timeout_s=settings.request_timeout_s,
        doc_token_budget=settings.document_tokens,
        counter=counter,
        cache=cache,
        backpressure=Backpressure(limit=AdaptiveLimit(settings.max_concurrent), global_limiter=limiter),
        max_retry_s=settings.max_retry_s,
        budget=RunBudget(settings.run_token_budget) if settings.run_token_budget else None,
        max_concurrent=settings.max_concurrent,
    )
