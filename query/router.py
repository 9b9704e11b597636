"""Heuristic query routing, as a pure function of the query text.

:func:`route` reads cheap surface signals from a query and returns a :class:`Route`:

- ``complexity`` in [0, 1] — a fixed-weight sum of length, comparison, temporal, aggregation and multi-hop
  signals (the shares sum to 1, see ``_LENGTH_SHARE`` and the others);
- ``limit_multiplier`` in [1, ``MAX_LIMIT_MULTIPLIER``] — ``1 + (MAX − 1) · complexity``: how many times the
  base over-fetch each leg should fetch, because a complex query's answer is less likely to sit at the top of
  any one leg;
- ``keyword_weight`` / ``vector_weight`` — RRF leg weights ``1 ± MAX_LEAN · lean``. Identifier-like tokens,
  quoted phrases, code symbols and one- or two-word queries lean keyword; questions and long descriptive
  sentences lean vector. The two weights always sum to 2 (the convention of
  :func:`shardfuse.query.fusion.rrf_weighted`), so each lies in [0.7, 1.3]: the favoured leg counts at most
  1.3 / 0.7 ≈ 1.9 times the other, enough to break ties between single-leg hits without reshaping a
  ranking in which most of the top hits are found by both legs.

No I/O and no state: every pattern is compiled once at import. The work is linear in the query's length:
one pass over the whitespace-separated tokens, set look-ups over the words and word pairs, and a few regex
scans that open on a rare character — about 0.05 ms for a typical query and 1–2 ms for a 4096-character one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LIMIT_MULTIPLIER = 3.0
MAX_LEAN = 0.3  # leg weights stay within 1 ± MAX_LEAN

# Each signal's share of the complexity score; they sum to 1 so the score needs no rescaling.
_LENGTH_SHARE = 0.25
_COMPARISON_SHARE = 0.20
_TEMPORAL_SHARE = 0.10
_AGGREGATION_SHARE = 0.15
_MULTI_HOP_SHARE = 0.30
# Length adds nothing up to _SHORT_WORDS words and its full share from _LONG_WORDS words on.
_SHORT_WORDS = 3
_LONG_WORDS = 20

# Cue words and word pairs, matched against the query's case-folded ``\w+`` words. Set look-ups keep the
# scan linear with a small constant; a ``\b(?:…|…)`` alternation is tried at every word boundary and costs
# milliseconds on a long query.
_COMPARISON_WORDS = frozenset({
    "vs", "versus", "compare", "compared", "compares", "comparing", "comparison", "comparisons", "tradeoff",
    "tradeoffs",
})
_COMPARISON_PAIRS = frozenset({
    ("difference", "between"), ("differences", "between"), ("different", "from"), ("differs", "from"),
    ("differ", "from"), ("pros", "and"), ("trade", "off"), ("trade", "offs"), ("instead", "of"),
    ("rather", "than"),
})
# "<comparative> than" and "more|less <word> than".
_COMPARATIVES = frozenset({
    "better", "worse", "faster", "slower", "cheaper", "larger", "smaller", "bigger", "higher", "lower",
    "newer", "older",
})
_MORE_OR_LESS = frozenset({"more", "less"})
_TEMPORAL_WORDS = frozenset({
    "before", "after", "since", "until", "till", "during", "when", "latest", "recent", "recently", "newest",
    "oldest", "earliest", "ago", "yesterday", "today", "previous", "previously",
})
_TEMPORAL_PAIRS = frozenset(
    {("last", unit) for unit in ("week", "month", "year", "release", "version", "time")}
    | {("first", unit) for unit in ("time", "version", "release")}
)
_AGGREGATION_WORDS = frozenset({"count", "counts", "counting", "total", "average", "mean", "median"})
_AGGREGATION_PAIRS = frozenset({
    ("how", "many"), ("how", "much"), ("list", "all"), ("list", "every"), ("list", "the"), ("list", "of"),
    ("number", "of"), ("sum", "of"),
})
_CHAIN_PAIRS = frozenset({("and", "then"), ("after", "that"), ("followed", "by"), ("which", "then"), ("in", "turn")})
# "which … that …": a relative clause chained onto a question.
_RELATIVE_HEADS = frozenset({"which", "whose"})
_RELATIVE_TAILS = frozenset({"that", "which", "who", "whose", "where"})
# Interrogatives that open a question of their own ("what … and why …"); "when"/"where" are left out
# because they mostly open a subordinate clause ("what happens when …").
_INTERROGATIVES = frozenset({"what", "which", "who", "whom", "whose", "why", "how"})
_QUESTION_OPENERS = frozenset({
    "how", "what", "why", "when", "where", "which", "who", "whom", "whose", "is", "are", "does", "do", "did",
    "can", "could", "should", "would", "will", "has", "have", "was", "were", "explain", "describe",
})
_WORD = re.compile(r"\w+")
# Each alternative opens with a quote character, so the scan skips ahead to quotes; the lookbehind keeps
# apostrophes ("document's") from opening a single-quoted phrase.
_QUOTED = re.compile(r"\"[^\"\n]+\"|“[^”\n]+”|`[^`\n]+`|'(?<!\w')[^'\n]+'(?!\w)")
_OPERATORS = ("::", "->", "=>", "==", "!=", "<=", ">=", "&&", "||", "{", "}", ";", "`")
# "f(" or "x[" (not the plural "file(s)"): the pattern opens on the bracket, so the scan skips to brackets.
_CALL_OR_INDEX = re.compile(r"[(\[](?<=\w[(\[])(?!s\))")

# One whitespace-separated token, punctuation stripped, is identifier-like when it is one of these.
_IDENTIFIER = re.compile(
    r"_*[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_*"  # snake_case, SCREAMING_SNAKE, __dunder__
    r"|[a-z][a-z0-9]*[A-Z][A-Za-z0-9]*"  # camelCase
    r"|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*"  # PascalCase with at least two humps
    r"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"  # dotted.name, file.ext
    r"|[\w.\-]+(?:/[\w.\-]+)+"  # a/path/like/this
)
_CALL = re.compile(r"[A-Za-z_][\w.]*\((?!s\))")  # foo() or foo(x, but not the plural in "file(s)"
_NAME_SEPARATOR = re.compile(r"[._/\-]")
_STRIP = ".,;:!?\"'()[]{}<>`“”‘’"
_SENTENCE_END = (".", "!", "?", ":")


@dataclass(frozen=True, slots=True)
class RouteFeatures:
    """The surface signals :func:`route` read from a query."""

    words: int = 0
    identifiers: int = 0  # identifier-like tokens: snake_case, camelCase, dotted.names, paths, foo()
    quoted_phrases: int = 0
    code_symbols: bool = False  # operators, braces, backticks, calls
    question: bool = False  # opens with a question word or contains "?"
    comparison: bool = False
    temporal: bool = False
    aggregation: bool = False
    multi_hop: bool = False  # chained clauses, a nested question or three or more named entities
    entities: int = 0  # distinct capitalised words (not opening a sentence) and identifiers


@dataclass(frozen=True, slots=True)
class Route:
    """How to search one query: the legs' over-fetch multiplier and fusion weights."""

    complexity: float = 0.0
    limit_multiplier: float = 1.0
    keyword_weight: float = 1.0
    vector_weight: float = 1.0
    features: RouteFeatures = RouteFeatures()

    @property
    def alpha(self) -> float:
        """The vector leg's share of the weight, for the alpha-based fusions (0.5 when neutral)."""
        return self.vector_weight / (self.keyword_weight + self.vector_weight)


NEUTRAL = Route()  # what to use when routing is switched off: plain over-fetch, equal weights


def route(query: str) -> Route:
    """Route ``query`` by its surface signals; any string (empty, any script, any length) is accepted."""
    features = extract_features(query)
    complexity = _complexity(features)
    lean = _lean(features)
    return Route(
        complexity=complexity,
        limit_multiplier=1.0 + (MAX_LIMIT_MULTIPLIER - 1.0) * complexity,
        keyword_weight=1.0 + MAX_LEAN * lean,
        vector_weight=1.0 - MAX_LEAN * lean,
        features=features,
    )


def extract_features(query: str) -> RouteFeatures:
    """The signals of :class:`RouteFeatures`: one pass over the tokens, one over the words, a few scans."""
    tokens = query.split()
    identifiers, entities = _names(tokens)
    words = _WORD.findall(query.casefold())
    distinct = frozenset(words)
    pairs = frozenset(zip(words, words[1:], strict=False))
    head = next((i for i, word in enumerate(words) if word in _RELATIVE_HEADS), None)
    relative_chain = head is not None and not _RELATIVE_TAILS.isdisjoint(words[head + 1 :])
    nested_question = query.count("?") >= 2 or sum(map(_INTERROGATIVES.__contains__, words)) >= 2
    return RouteFeatures(
        words=len(tokens),
        identifiers=identifiers,
        quoted_phrases=len(_QUOTED.findall(query)),
        code_symbols=any(op in query for op in _OPERATORS) or _CALL_OR_INDEX.search(query) is not None,
        question="?" in query or (bool(words) and words[0] in _QUESTION_OPENERS),
        comparison=not (_COMPARISON_WORDS.isdisjoint(distinct) and _COMPARISON_PAIRS.isdisjoint(pairs))
        or _has_comparative(words),
        temporal=not (_TEMPORAL_WORDS.isdisjoint(distinct) and _TEMPORAL_PAIRS.isdisjoint(pairs))
        or any(_is_year(word) for word in distinct),
        aggregation=not (_AGGREGATION_WORDS.isdisjoint(distinct) and _AGGREGATION_PAIRS.isdisjoint(pairs))
        or any(first == "top" and second.isdigit() for first, second in pairs),
        multi_hop=not _CHAIN_PAIRS.isdisjoint(pairs) or relative_chain or nested_question or len(entities) >= 3,
        entities=len(entities),
    )


def identifiers(query: str) -> list[str]:
    """The query's identifier-like tokens (punctuation around them stripped), each once, in order: what the
    grep leg of hybrid search looks for verbatim (query/grep/service.py)."""
    cores = (token.strip(_STRIP) for token in query.split() if _is_identifier(token, token.strip(_STRIP)))
    return list(dict.fromkeys(cores))


def _names(tokens: list[str]) -> tuple[int, set[str]]:
    """How many distinct identifier-like tokens, and the distinct named entities (identifiers included)."""
    identifiers: set[str] = set()
    entities: set[str] = set()
    sentence_start = True
    for token in tokens:
        core = token.strip(_STRIP)
        if _is_identifier(token, core):
            identifiers.add(core)
            entities.add(core.casefold())
        elif core[:1].isupper() and not sentence_start:
            entities.add(core.casefold())
        sentence_start = token.endswith(_SENTENCE_END)
    return len(identifiers), entities


def _is_identifier(token: str, core: str) -> bool:
    if len(core) < 2:
        return False
    if "(" in token and _CALL.match(token.lstrip(_STRIP)):
        return _has_long_part(core)
    if core.isalnum() and (core.islower() or core.isupper() or core[1:].islower()):
        return False  # a plain word, an acronym or a Capitalised word: the common case, decided cheaply
    return _IDENTIFIER.fullmatch(core) is not None and _has_long_part(core)


def _has_comparative(words: list[str]) -> bool:
    for i, word in enumerate(words):
        if word == "than" and i > 0 and (words[i - 1] in _COMPARATIVES or (i > 1 and words[i - 2] in _MORE_OR_LESS)):
            return True
    return False


def _is_year(word: str) -> bool:
    return len(word) == 4 and word.isdigit() and word[:2] in ("19", "20")


def _has_long_part(core: str) -> bool:
    # "e.g", "i.e", "a/b": abbreviations and fractions, not names.
    return any(len(part) >= 2 for part in _NAME_SEPARATOR.split(core))


def _complexity(features: RouteFeatures) -> float:
    length = min(max((features.words - _SHORT_WORDS) / (_LONG_WORDS - _SHORT_WORDS), 0.0), 1.0)
    score = (
        _LENGTH_SHARE * length
        + _COMPARISON_SHARE * features.comparison
        + _TEMPORAL_SHARE * features.temporal
        + _AGGREGATION_SHARE * features.aggregation
        + _MULTI_HOP_SHARE * features.multi_hop
    )
    return min(max(score, 0.0), 1.0)


def _lean(features: RouteFeatures) -> float:
    """In [-1, 1]: positive leans keyword, negative leans vector."""
    keyword = 0.0
    if features.identifiers:
        keyword += 0.6 if features.identifiers == 1 else 0.8
    if features.quoted_phrases:
        keyword += 0.3
    if features.code_symbols:
        keyword += 0.3
    if 0 < features.words <= 2 and not features.question:
        keyword += 0.2  # a name or two: BM25's home ground
    vector = 0.0
    if features.question:
        vector += 0.4
    # Descriptive prose: nothing up to 5 words, the full 0.6 from 15 words on.
    vector += 0.6 * min(max((features.words - 5) / 10, 0.0), 1.0)
    return min(max(keyword - vector, -1.0), 1.0)
