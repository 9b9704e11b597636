"""Embedding providers behind one port, :class:`Embedder`.

``LocalEmbedder`` imports sentence-transformers only when constructed, so importing this package stays
cheap and works without the ``local`` extra.
"""

from pipeline.embeddings.base import Embedder, Vectors
from pipeline.embeddings.factory import build_embedder
from pipeline.embeddings.hashing import HashingEmbedder
from pipeline.embeddings.local import LocalEmbedder

__all__ = ["Embedder", "HashingEmbedder", "LocalEmbedder", "Vectors", "build_embedder"]
