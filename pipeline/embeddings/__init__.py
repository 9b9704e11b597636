"""Embedding providers behind one port, :class:`Embedder`.

``LocalEmbedder`` imports sentence-transformers only when constructed, and the remote adapters
(``OpenAIEmbedder``, ``VoyageEmbedder``) import their SDKs the same way, so importing this package stays
cheap and works without the ``local`` extra or the voyageai SDK.
"""

from pipeline.embeddings.base import Embedder, Vectors
from pipeline.embeddings.factory import build_embedder, request_batch_size
from pipeline.embeddings.hashing import HashingEmbedder
from pipeline.embeddings.limits import (
    FittedInput,
    OversizeRule,
    ProviderLimits,
    TiktokenCounter,
    TokenCounting,
    fit_input,
    merge_pieces,
)
from pipeline.embeddings.local import LocalEmbedder
from pipeline.embeddings.openai_embedder import OpenAIEmbedder
from pipeline.embeddings.voyage_embedder import VoyageEmbedder

__all__ = [
    "Embedder",
    "FittedInput",
    "HashingEmbedder",
    "LocalEmbedder",
    "OpenAIEmbedder",
    "OversizeRule",
    "ProviderLimits",
    "TiktokenCounter",
    "TokenCounting",
    "Vectors",
    "VoyageEmbedder",
    "build_embedder",
    "fit_input",
    "merge_pieces",
    "request_batch_size",
]
