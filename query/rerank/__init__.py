"""Reranking after fusion (optional, off by default: ``[rerank] provider``).

- :mod:`~shardfuse.query.rerank.port`: the :class:`Reranker` port and the failures only rerankers have;
- :mod:`~shardfuse.query.rerank.stage`: :class:`RerankStage`, the step a search runs after fusion and boosts,
  within ``rerank.budget_ms``, falling back to the fused order;
- adapters: :mod:`~shardfuse.query.rerank.cross_encoder` (a local sentence-transformers cross-encoder),
  :mod:`~shardfuse.query.rerank.voyage_rerank` (the voyageai SDK), :mod:`~shardfuse.query.rerank.http_rerank`
  (the ``/rerank`` HTTP APIs of Cohere, Jina and TEI);
- :mod:`~shardfuse.query.rerank.factory`: the reranker the settings name, built when the query worker starts.
"""

from shardfuse.query.rerank.factory import build_reranker, build_stage
from shardfuse.query.rerank.port import MalformedRerankError, Reranker, RerankTimeoutError
from shardfuse.query.rerank.stage import RerankStage

__all__ = ["MalformedRerankError", "RerankStage", "RerankTimeoutError", "Reranker", "build_reranker", "build_stage"]
