"""The reranker ``[rerank]`` configures, built once per query worker when it starts.

A provider that cannot work as configured (no model folder, no SDK, no key) is a
:class:`~shardfuse.pipeline.core.errors.ConfigurationError` here, at start-up, not a fallback on every query.
"""

from __future__ import annotations

from shardfuse.pipeline.config.rerank import RerankSettings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.query.rerank.http_rerank import APIS, HttpReranker
from shardfuse.query.rerank.port import Reranker
from shardfuse.query.rerank.stage import RerankStage


def build_reranker(settings: RerankSettings) -> Reranker | None:
    """The reranker of ``settings.provider`` (None for ``none``)."""
    provider, model = settings.provider, settings.resolved_model
    if provider == "none":
        return None
    if provider == "local":
        from shardfuse.query.rerank.cross_encoder import CrossEncoderReranker

        return CrossEncoderReranker(model, batch_size=settings.batch_size, max_length=settings.max_length)
    if provider == "voyage":
        from shardfuse.query.rerank.voyage_rerank import VoyageReranker

        return VoyageReranker(model, api_key=settings.api_key, base_url=settings.resolved_base_url)
    if provider in ("cohere", "jina") and not settings.api_key.get_secret_value():
        raise ConfigurationError(f"rerank.provider = {provider} needs an API key: set SHARDFUSE_RERANK__API_KEY")
    return HttpReranker(APIS[provider], provider=provider, model=model, base_url=settings.resolved_base_url,
                        api_key=settings.api_key)


def build_stage(settings: RerankSettings) -> RerankStage:
    """The query worker's rerank step: the configured reranker (or none) with its budget."""
    return RerankStage(build_reranker(settings), settings)
