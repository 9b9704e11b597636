"""What the chunk filter (:mod:`shardfuse.pipeline.ingest.chunk_filter`) measures of a chunk, as pure functions:
the entropy of its tokens, the entities it names, its word-shingle sketch, and the similarity of a sketch to
the sketches of the last kept chunks (:class:`KeptWindow`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from itertools import repeat

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

# A word n-gram, its words joined by single spaces (words hold no spaces, so the joining is reversible).
Shingle = str


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


class KeptWindow:
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
