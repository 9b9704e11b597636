"""Entropy-aware filtering of low-information chunks, run per document before any embedding is paid for.

After SimpleMem (arXiv 2601.02553). :func:`filter_chunks` takes one document's chunk texts in document order
and returns one :class:`ChunkVerdict` per chunk. Each chunk is checked in this order; the first rule that
fires drops it:

1. ``DUPLICATE``: its whitespace-normalised text (``" ".join(text.split())``) equals an earlier chunk's.
   Earlier texts are remembered as 128-bit BLAKE2b digests in a set (one per chunk, no window).
2. ``NEAR_EMPTY``: fewer than ``min_tokens`` *content* tokens: tokens whose text is not only whitespace
   and Unicode punctuation (categories ``P*``: ``-``, ``}``, ``.``, quotes). Symbols (``=``, ``|``, ``+``)
   are content, so a long run of them reaches the entropy rule; a token holding part of a multi-byte
   character (it decodes to U+FFFD) is content too.
3. ``BOILERPLATE``: Shannon entropy, in bits, of the chunk's token-id distribution below
   ``min_entropy_bits``. A text of ``k`` distinct tokens repeated any number of times has ``log2(k)`` bits at
   most, so only lines of fewer than ``2**min_entropy_bits`` (5.7 by default) distinct tokens score as
   boilerplate however often they repeat; longer repeated lines are left to rules 1 and 4.
4. ``LOW_INFORMATION``: ``score = alpha * entity_novelty + (1 - alpha) * semantic_novelty`` below
   ``threshold`` (see :func:`extract_entities` and :func:`lexical_sketch` for the two inputs).

The measures (entropy, entities, sketches, the window of kept sketches) are pure functions of
:mod:`shardfuse.pipeline.ingest.chunk_signals`, importable from here as well; this module holds the rules.

Guarantees: pure and deterministic (no randomness, no dependence on ``PYTHONHASHSEED``); one verdict per
text, ``verdicts[i].index == i``; chunk 0 is never ``LOW_INFORMATION``; a non-empty document always keeps
at least one chunk. When every chunk would be dropped, the one with the highest entropy (the earliest on a
tie) is kept with ``reason=None``.

Cost is linear in the document: each chunk's sketch is compared only with the sketches of the last
:data:`KEPT_WINDOW` kept chunks, through an index from shingle to window slots, so a chunk costs
O(its shingles + slots sharing a shingle with it). Redundancy with a chunk further back is not detected.
"""

from __future__ import annotations

import enum
import hashlib
import math
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from shardfuse.pipeline.core.deadline import checkpoint
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunk_signals import KeptWindow, extract_entities, lexical_sketch, token_entropy

# The measures are defined in chunk_signals and importable from here too, where the rules that use them are.
__all__ = [
    "KEPT_WINDOW",
    "NO_ENTITY_NOVELTY_FIRST",
    "NO_ENTITY_NOVELTY_LATER",
    "ChunkVerdict",
    "DropReason",
    "FilterSettings",
    "drop_counts",
    "extract_entities",
    "filter_chunks",
    "lexical_sketch",
    "token_entropy",
]

# Kept chunks whose sketches a new chunk is compared against: bounds the work per chunk.
KEPT_WINDOW = 64
# entity_novelty of a chunk without entities: nothing new is named, but nothing is repeated either.
NO_ENTITY_NOVELTY_FIRST = 1.0
NO_ENTITY_NOVELTY_LATER = 0.5

# The inclusive range of each FilterSettings field.
_SETTING_BOUNDS = {
    "alpha": (0.0, 1.0),
    "threshold": (0.0, 1.0),
    "min_tokens": (0, math.inf),
    "min_entropy_bits": (0.0, math.inf),
    "sketch_ngram": (1, math.inf),
}


class DropReason(enum.StrEnum):
    """Why a chunk was dropped; the values are stored per document (``{"duplicate": 2, ...}``)."""

    DUPLICATE = "duplicate"
    NEAR_EMPTY = "near_empty"
    BOILERPLATE = "boilerplate"
    LOW_INFORMATION = "low_information"
    # Not decided here: another document of the zone indexed the same text first (pipeline/ingest/preparation.py).
    REPEATED = "repeated"


@dataclass(frozen=True, slots=True)
class FilterSettings:
    """Thresholds of :func:`filter_chunks`; ``alpha`` and ``threshold`` must lie in [0, 1] (else ValueError).

    ``sketch_ngram`` is the length of the *word* shingles of :func:`lexical_sketch`.
    """

    alpha: float = 0.5
    threshold: float = 0.35
    min_tokens: int = 8
    min_entropy_bits: float = 2.5
    sketch_ngram: int = 3

    def __post_init__(self) -> None:
        for name, (low, high) in _SETTING_BOUNDS.items():
            value = getattr(self, name)
            if not low <= value <= high:  # also rejects NaN
                raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


@dataclass(frozen=True, slots=True)
class ChunkVerdict:
    """The filter's decision on chunk ``index``.

    ``reason`` is None exactly when ``kept``. ``score`` and the two novelties are None for chunks dropped
    before scoring (rules 1-3). ``tokens`` counts all the chunk's tokens, not only content tokens.
    """

    index: int
    kept: bool
    reason: DropReason | None
    score: float | None
    entity_novelty: float | None
    semantic_novelty: float | None
    entropy_bits: float
    tokens: int


def filter_chunks(texts: Sequence[str], *, counter: TokenCounter, settings: FilterSettings) -> list[ChunkVerdict]:
    """Decide which of one document's chunks (in document order) are worth embedding; see the module doc."""
    seen_digests: set[bytes] = set()
    seen_entities: set[str] = set()
    window = KeptWindow(KEPT_WINDOW)
    content = _ContentTokens(counter)
    verdicts: list[ChunkVerdict] = []
    for index, text in enumerate(texts):
        if not index & 0x3F:
            checkpoint("filtering its chunks")
        tokens = counter.encode(text)
        entropy = token_entropy(tokens)
        entities = extract_entities(text)
        digest = hashlib.blake2b(" ".join(text.split()).encode(), digest_size=16).digest()
        reason: DropReason | None = None
        if digest in seen_digests:
            reason = DropReason.DUPLICATE
        elif content.count(tokens, limit=settings.min_tokens) < settings.min_tokens:
            reason = DropReason.NEAR_EMPTY
        elif entropy < settings.min_entropy_bits:
            reason = DropReason.BOILERPLATE
        seen_digests.add(digest)
        if reason is not None:
            seen_entities |= entities
            verdicts.append(ChunkVerdict(index, False, reason, None, None, None, entropy, len(tokens)))
            continue
        entity_novelty = _entity_novelty(entities, seen_entities, first=index == 0)
        seen_entities |= entities
        sketch = lexical_sketch(text, settings.sketch_ngram)
        semantic_novelty = 1.0 - window.max_jaccard(sketch)
        score = settings.alpha * entity_novelty + (1.0 - settings.alpha) * semantic_novelty
        # Chunk 0 has nothing before it to be redundant with.
        kept = index == 0 or score >= settings.threshold
        if kept:
            window.add(sketch)
        reason = None if kept else DropReason.LOW_INFORMATION
        verdicts.append(
            ChunkVerdict(index, kept, reason, score, entity_novelty, semantic_novelty, entropy, len(tokens))
        )
    return _keep_at_least_one(verdicts)


def drop_counts(verdicts: Iterable[ChunkVerdict]) -> dict[str, int]:
    """Dropped chunks per reason value, in :class:`DropReason` order; only reasons that occurred."""
    counts = Counter(v.reason for v in verdicts if not v.kept and v.reason is not None)
    return {reason.value: counts[reason] for reason in DropReason if counts[reason]}


def _entity_novelty(entities: frozenset[str], seen: set[str], *, first: bool) -> float:
    if not entities:
        return NO_ENTITY_NOVELTY_FIRST if first else NO_ENTITY_NOVELTY_LATER
    return len(entities - seen) / len(entities)


def _keep_at_least_one(verdicts: list[ChunkVerdict]) -> list[ChunkVerdict]:
    if not verdicts or any(v.kept for v in verdicts):
        return verdicts
    # max() returns the first of equal maxima: the earliest chunk wins a tie.
    best = max(verdicts, key=lambda v: v.entropy_bits)
    verdicts[best.index] = replace(best, kept=True, reason=None)
    return verdicts


class _ContentTokens:
    """Counts content tokens (see the module doc), memoising each token id's class for one call."""

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        self._is_content: dict[int, bool] = {}

    def count(self, tokens: Sequence[int], *, limit: int) -> int:
        """The number of content tokens in ``tokens``, or ``limit`` once that many are found."""
        found = 0
        for token in tokens:
            if found >= limit:
                break
            is_content = self._is_content.get(token)
            if is_content is None:
                # Part of a multi-byte character decodes to U+FFFD, a symbol (So): content, as intended.
                piece = self._counter.decode([token])
                is_content = any(not ch.isspace() and unicodedata.category(ch)[0] != "P" for ch in piece)
                self._is_content[token] = is_content
            found += is_content
        return found


