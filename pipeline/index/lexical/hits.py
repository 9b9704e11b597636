"""The result type of a lexical search."""

from __future__ import annotations

from typing import NamedTuple


class LexicalHit(NamedTuple):
    """One chunk matched by a BM25 query, with its BM25 score (always > 0)."""

    chunk_id: str
    score: float
