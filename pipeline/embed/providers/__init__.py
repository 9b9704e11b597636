"""Embedding providers behind one port, :class:`Embedder`.

``LocalEmbedder`` imports sentence-transformers only when constructed, and the remote adapters
(``OpenAIEmbedder``, ``VoyageEmbedder``) import their SDKs the same way, so importing this package stays
cheap and works without the ``local`` extra or the voyageai SDK.
"""

from shardfuse.pipeline.embed.providers.base import Embedder, Vectors
from shardfuse.pipeline.embed.providers.factory import build_embedder, request_batch_size
from shardfuse.pipeline.embed.providers.hashing import HashingEmbedder
from shardfuse.pipeline.embed.providers.input_limits import (
    FittedInput,
    OversizeRule,
    ProviderLimits,
    TiktokenCounter,
    TokenCounting,
    fit_input,
    merge_pieces,
)
from shardfuse.pipeline.embed.providers.local import LocalEmbedder
from shardfuse.pipeline.embed.providers.openai import OpenAIEmbedder
from shardfuse.pipeline.embed.providers.voyage import VoyageEmbedder

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
