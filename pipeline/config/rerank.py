"""The ``[rerank]`` section: an optional reranking stage after fusion (off by default), part of
:class:`shardfuse.pipeline.config.settings.Settings`.

The query worker builds the configured reranker once, at start-up (:mod:`shardfuse.query.rerank`); a request
may switch it off (or on, when ``enabled = false``) with its ``rerank`` argument. Whatever the provider, the
whole step (retries, waits, the model) fits in ``budget_ms``: past it, or on any failure, the fused order is
returned and the answer says why.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from shardfuse.pipeline.config.section import Section

RerankProvider = Literal["none", "local", "voyage", "cohere", "jina", "tei"]

# The model each hosted provider uses when rerank.model is empty; TEI serves the one model it was started with.
DEFAULT_MODELS: dict[str, str] = {
    "voyage": "rerank-2.5",
    "cohere": "rerank-v3.5",
    "jina": "jina-reranker-v2-base-multilingual",
}
# Where each provider's API is when rerank.base_url is empty (voyage: the voyageai SDK's own choice).
DEFAULT_BASE_URLS: dict[str, str] = {
    "cohere": "https://api.cohere.com",
    "jina": "https://api.jina.ai",
}


class RerankSettings(Section):
    """Which reranker reorders the best fused candidates, and how long it may take."""

    # none: no reranking; local: a sentence-transformers cross-encoder in the query worker (the ``local`` extra);
    # voyage: Voyage's rerank API (voyageai SDK); cohere, jina, tei: their ``/rerank`` HTTP APIs.
    provider: RerankProvider = "none"
    # With a provider set, requests that do not say ``rerank`` are reranked; false: only those that say true.
    enabled: bool = True
    # local: a cross-encoder folder (what CrossEncoder.save wrote) or a Hugging Face model name already in the
    # local cache; hosted: the API's model name (empty: DEFAULT_MODELS; TEI ignores it).
    model: str = ""
    # Hosted APIs only; empty: DEFAULT_BASE_URLS (TEI has none: name your server, e.g. http://tei:8080).
    base_url: str = ""
    # From the environment: SHARDFUSE_RERANK__API_KEY. Never logged or shown.
    api_key: SecretStr = SecretStr("")
    # The fused (and boosted) candidates sent to the reranker, at most the hydrated ones (query.rerank_depth, at
    # least 1.5 × k). A reranked result's score is the reranker's (a request's min_score compares with it);
    # results below them keep their fused order and score.
    top_n: int = Field(default=30, ge=1, le=1000)
    # The whole step, retries and waits included. A local cross-encoder checks it between batches.
    budget_ms: int = Field(default=1000, ge=10, le=60_000)
    # Attempts at most (a retry starts only when its wait, at least a Retry-After, fits in the budget).
    max_attempts: int = Field(default=2, ge=1, le=5)
    # Each candidate's text (its context, then the chunk) is cut to this many characters before it is sent.
    max_chars: int = Field(default=4000, ge=100)
    # local only: pairs per forward pass, and the model's input limit in its own tokens (None: the model's).
    batch_size: int = Field(default=8, ge=1)
    max_length: int | None = Field(default=None, ge=16)

    @model_validator(mode="after")
    def _check(self) -> RerankSettings:
        if self.provider == "local" and not self.model:
            raise ValueError("rerank.provider = local needs rerank.model: a cross-encoder folder (CrossEncoder.save) "
                             "or the name of one in the local Hugging Face cache")
        if self.provider == "tei" and not self.base_url:
            raise ValueError("rerank.provider = tei needs rerank.base_url: the text-embeddings-inference server "
                             "(e.g. http://127.0.0.1:8080)")
        return self

    @property
    def active(self) -> bool:
        """True when a reranker is configured."""
        return self.provider != "none"

    @property
    def resolved_model(self) -> str:
        """The model the provider is asked for."""
        return self.model or DEFAULT_MODELS.get(self.provider, "")

    @property
    def resolved_base_url(self) -> str:
        """The API's base URL, without a trailing slash ("" for voyage: the SDK's default)."""
        return (self.base_url or DEFAULT_BASE_URLS.get(self.provider, "")).rstrip("/")
