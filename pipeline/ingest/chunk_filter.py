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
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import repeat

from shardfuse.pipeline.core.token_counting import TokenCounter

# Kept chunks whose sketches a new chunk is compared against: bounds the work per chunk.
KEPT_WINDOW = 64
# entity_novelty of a chunk without entities: nothing new is named, but nothing is repeated either.
NO_ENTITY_NOVELTY_FIRST = 1.0
NO_ENTITY_NOVELTY_LATER = 0.5

# Entity candidates: a number (10,000 / 3.11 / 300ms), or a word whose lowercase ASCII prefix is followed
# by a capital, digit, underscore or inner dot (with any dotted tail). Possessive quantifiers make a plain
# lowercase word fail at its first non-letter, without backtracking, so the regex skips them in C.
_CANDIDATE = r"\b(?:\d++(?:[.,:]\d++)*+[^\W_]*+|[a-z]*+(?:[A-Z0-9_]|\.(?=\w))\w*+(?:\.\w++)*+)"
_DIGIT = re.compile(r"\d")
# Skipped when looking back from a Capitalised word for the end of the previous sentence: whitespace,
# opening quotes and brackets, and Markdown markers (headings, quotes, bullets, emphasis, code).
_OPENERS = " \t\r\n\"'([{*`#>+-\u201c\u2018"
_LOOKBACK = 64
_SENTENCE_END = ".!?"
_WORD = r"\w+"
# Each pattern compiled twice: re.ASCII matches ASCII text the same way, about twice as fast.
_PATTERNS = {
    name: (re.compile(pattern, re.ASCII), re.compile(pattern))
    for name, pattern in [("candidate", _CANDIDATE), ("word", _WORD)]
}

# The inclusive range of each FilterSettings field.
_SETTING_BOUNDS = {
    "alpha": (0.0, 1.0),
    "threshold": (0.0, 1.0),
    "min_tokens": (0, math.inf),
    "min_entropy_bits": (0.0, math.inf),
    "sketch_ngram": (1, math.inf),
}
# A word n-gram, its words joined by single spaces (words hold no spaces, so the joining is reversible).
Shingle = str


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


def token_entropy(tokens: Sequence[int]) -> float:
    """Shannon entropy in bits of the token-id distribution of ``tokens``; 0.0 for no tokens."""
    if not tokens:
        return 0.0
    # H = log2(N) - sum(n log2 n) / N over the count n of each distinct token, grouping the tokens that share a
    # count (a few groups, not one term per token). fsum is correctly rounded, so the order of the groups
    # does not matter; max() absorbs rounding below 0 when there is one distinct token.
    total = len(tokens)
    groups = Counter(Counter(tokens).values())
    return max(0.0, math.log2(total) - math.fsum(k * n * math.log2(n) for n, k in groups.items()) / total)


def extract_entities(text: str) -> frozenset[str]:
    """The named things in ``text``, case-sensitive.

    Candidates are maximal runs of word characters (with any ``.``-joined tail) holding an ASCII capital, a
    digit, an underscore or a dot; a candidate is an entity when it is one of:

    - anything holding a digit: numbers (``42``, ``3.11``, ``10,000``, ``300ms``) and ``BM25``, ``v1.2``;
    - a dotted name whose every part has at least two characters (``os.path.join``, ``README.md``; not
      ``e.g``);
    - a word holding an underscore beside a letter (``snake_case``, ``MAX_SIZE``, ``__init__``);
    - a word with a capital after its first character (``camelCase``, ``TokenCounter``, ``RRF``);
    - a Capitalised word of two or more characters that is not sentence-initial: not at the start of the
      text, not after ``.``/``!``/``?``, a blank line or a line starting with a Markdown marker
      (``#``, ``-``, ``*``, ``+``, ``>``), ignoring whitespace, opening quotes/brackets and such markers.
    """
    entities: set[str] = set()
    for match in _pattern("candidate", text).finditer(text):
        word = match.group()
        if _is_entity(word) or (word[0].isupper() and len(word) > 1 and not _sentence_initial(text, match.start())):
            entities.add(word)
    return frozenset(entities)


def lexical_sketch(text: str, ngram: int) -> frozenset[Shingle]:
    """The set of ``ngram``-word shingles of ``text``, lower-cased; words are ``\\w+`` runs.

    Word shingles, not character shingles: a changed word changes ``ngram`` shingles, whatever its length,
    and the shingles stay meaningful for code as well as prose. A text of fewer than ``ngram`` words has one
    shingle (all its words), a text without words none. Shingles are kept as strings, not hashed: no
    collisions, so similarity is exact.
    """
    lowered = text.lower()
    words = _pattern("word", lowered).findall(lowered)
    if len(words) < ngram:
        return frozenset([" ".join(words)]) if words else frozenset()
    # Strings rather than tuples: a string caches its hash, and strings are not tracked by the cyclic GC.
    return frozenset(map(" ".join, zip(*(words[i:] for i in range(ngram)), strict=False)))


def filter_chunks(texts: Sequence[str], *, counter: TokenCounter, settings: FilterSettings) -> list[ChunkVerdict]:
    """Decide which of one document's chunks (in document order) are worth embedding; see the module doc."""
    seen_digests: set[bytes] = set()
    seen_entities: set[str] = set()
    window = _KeptWindow(KEPT_WINDOW)
    content = _ContentTokens(counter)
    verdicts: list[ChunkVerdict] = []
    for index, text in enumerate(texts):
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


def _pattern(name: str, text: str) -> re.Pattern[str]:
    ascii_pattern, unicode_pattern = _PATTERNS[name]
    return ascii_pattern if text.isascii() else unicode_pattern


def _is_entity(word: str) -> bool:
    # The position-independent rules of extract_entities (everything but plain Capitalised words).
    if _DIGIT.search(word):
        return True
    if "." in word:
        return min(map(len, word.split("."))) >= 2
    if "_" in word:
        return word.strip("_") != ""  # no digits here, so what is left holds a letter
    rest = word[1:]
    return rest != rest.lower()  # a capital after the first character


def _sentence_initial(text: str, start: int) -> bool:
    head = text[max(0, start - _LOOKBACK) : start]
    before = head.rstrip(_OPENERS)
    if not before:
        # The start of the text, or a lookback window of nothing but markup: treated alike.
        return True
    if before[-1] in _SENTENCE_END:
        return True
    gap = head[len(before) :]
    if "\n" not in gap:
        return False
    # A blank line, or a line break followed by a Markdown marker (a heading, bullet or quote line).
    return gap.count("\n") > 1 or gap[gap.rfind("\n") + 1 :].strip() != ""


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


class _KeptWindow:
    """The sketches of the last ``size`` kept chunks, for exact Jaccard similarity against them.

    Sketches fill blocks of ``size`` slots; a block maps each shingle to the bitmask of its slots holding it.
    When the current block is full it becomes the previous one and the older block is dropped whole, so
    adding a sketch takes a few bulk dict and set operations, not a Python step per shingle. Slots of the
    previous block that are more than ``size`` kept sketches back are ignored: the window is exact.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._current: dict[Shingle, int] = {}
        self._current_sizes: list[int] = []
        self._previous: dict[Shingle, int] = {}
        self._previous_sizes: list[int] = []

    def max_jaccard(self, sketch: frozenset[Shingle]) -> float:
        """The highest Jaccard similarity between ``sketch`` and a sketch in the window; 0.0 when none."""
        best = 0.0
        # The previous block's first len(current) slots have left the window.
        for block, sizes, first_slot in (
            (self._current, self._current_sizes, 0),
            (self._previous, self._previous_sizes, len(self._current_sizes)),
        ):
            for slot, shared in _shared_per_slot(block, sketch).items():
                if slot >= first_slot:
                    best = max(best, shared / (len(sketch) + sizes[slot] - shared))
        return best

    def add(self, sketch: frozenset[Shingle]) -> None:
        """Add ``sketch`` as the newest kept sketch."""
        if len(self._current_sizes) == self._size:
            self._previous, self._previous_sizes = self._current, self._current_sizes
            self._current, self._current_sizes = {}, []
        current = self._current
        bit = 1 << len(self._current_sizes)
        self._current_sizes.append(len(sketch))
        # keys() & sketch and difference(dict) both iterate the sketch, never the block.
        for shingle in current.keys() & sketch:
            current[shingle] |= bit
        current.update(dict.fromkeys(sketch.difference(current), bit))


def _shared_per_slot(block: dict[Shingle, int], sketch: frozenset[Shingle]) -> dict[int, int]:
    # Count the sketch's shingles per bitmask in C; only the few distinct non-zero masks are walked here.
    shared: dict[int, int] = {}
    for mask, count in Counter(map(block.get, sketch, repeat(0))).items():
        while mask:
            low = mask & -mask
            slot = low.bit_length() - 1
            shared[slot] = shared.get(slot, 0) + count
            mask ^= low
    return shared
