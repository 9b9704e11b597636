"""Ranking after fusion: multipliers for where and how a candidate matched the query, as pure functions.

A candidate's factor is ``field × exactness + symbol bonuses``, and for a query that is one name, the chunks
defining it come first:

- **field** — for each field (``filename``: the path's basename; ``path``: its directory part; ``title``,
  ``tags`` and ``description`` from the metadata; ``content``: the text), ``coverage`` is the fraction of
  the query's distinct terms found among the field's terms, and the field scores
  ``1 + (weight − 1) · coverage``. The field factor is the *maximum* over fields, not the product: a query
  that names a file should not also be rewarded for the same words in its directory and title. A field
  whose weight is 1.0 can never raise the maximum, so it is skipped (and not tokenized at all): the default
  ``content = 1.0`` leaves content to BM25.
- **exactness** — ``× exact_phrase`` when the query's words occur as a contiguous run in the text, the title
  or the filename; otherwise ``× prefix`` when one of those *starts with* the query's first two words, the
  second possibly unfinished ("reciprocal rank fus" → "Reciprocal rank fusion"), or — for a one-word query —
  when its first word starts with the query ("pars" → ``parser.py``). Words are the case-folded ``\\w+``
  runs, so case, whitespace and punctuation between words do not matter. An exact phrase needs a query of
  two or more words: for one word it would just be a term match, which BM25 and the field factor already
  reward. At most one of the two applies.
- **definition tier** — for a query that is one name (``apply_async``, ``Task.apply_async()``), the chunks
  holding that name's definition header, then the rest of a split definition of it, rank above every other
  chunk (:func:`shardfuse.query.symbol_boosts.definition_tier`; ``definitions_first``): a bare name asks
  where it is defined. :func:`rerank` orders by tier, then score, and lifts each tier's scores above the
  best score below it, so the scores it returns still fall with the rank.
- **symbols** — ``+ primary_symbol`` / ``+ any_symbol`` when the chunk's primary symbol / any of its symbols
  matches the query, then ``+ complete_role`` / ``+ declaration_role`` for the chunk's role
  (:func:`shardfuse.query.symbol_boosts.symbol_bonus`, where matching is described).

Terms come from :class:`shardfuse.pipeline.index.lexical.Tokenizer` without stemming (so "chunk" does not match
"chunks").
The query is prepared once (:func:`prepare_query`); per candidate the work is tokenizing a few short
fields and one scan of the text for the phrase.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from shardfuse.pipeline.config.settings import BoostSettings
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer, split_identifier
from shardfuse.query.symbol_boosts import bare_name, definition_tier, symbol_bonus

T = TypeVar("T")

# Stateless (no stemmer), so a module constant is a function, not a cache.
_TOKENIZE = Tokenizer(stem=False)
_WORD = re.compile(r"\w+")
FIELDS = ("filename", "title", "path", "tags", "description", "content")  # heaviest (by default) first
_PREFIX_WORDS = 2  # how many of the query's leading words a field must open with for the prefix factor


@dataclass(frozen=True, slots=True)
class Candidate:
    """What boosting reads of one fused hit."""

    path: str
    text: str
    metadata: Mapping[str, Any]
    symbols: Sequence[str] = ()
    primary_symbol: str | None = None
    role: str | None = None  # "complete" (a whole definition), "declaration" (a signature), or other


@dataclass(frozen=True, slots=True)
class QueryTerms:
    """A query, prepared once for every candidate. Build it with :func:`prepare_query`."""

    query: str
    terms: frozenset[str]  # distinct tokens, identifier parts only (``parse_event`` → parse, event)
    words: tuple[str, ...]  # case-folded ``\w+`` words, in order, for prefix matching
    parts: str  # "_" + the query's lower-cased identifier parts joined by "_" + "_", for symbol matching
    # The pattern of the words with non-word runs between them (None under two words); compiled only for a
    # text that holds every word, which few candidates of a long query do.
    phrase: str | None = None
    # Matches a case-folded text whose first words are the query's first ``_PREFIX_WORDS`` words, the last
    # possibly unfinished (None for a query without words).
    opening: re.Pattern[str] | None = None
    name: str | None = None  # the name the whole query is (``Task.apply_async()`` → apply_async), else None


@dataclass(frozen=True, slots=True)
class Boost:
    """A candidate's multiplier and why, e.g. ``(1.85, ("title:0.67", "exact_phrase"))``, and its definition
    tier (0 unless the query is a name the candidate defines)."""

    factor: float = 1.0
    reasons: tuple[str, ...] = ()
    tier: int = 0


NO_BOOST = Boost()

_FIELD_READERS: Mapping[str, Callable[[Candidate], str]] = MappingProxyType({
    "filename": lambda c: posixpath.basename(_posix(c.path)),
    "path": lambda c: posixpath.dirname(_posix(c.path)),
    "title": lambda c: _metadata_text(c.metadata.get("title")),
    "tags": lambda c: _metadata_text(c.metadata.get("tags")),
    "description": lambda c: _metadata_text(c.metadata.get("description")),
    "content": lambda c: c.text,
})


def prepare_query(query: str) -> QueryTerms:
    """The query's distinct terms, its words and its identifier parts."""
    raw_words = _WORD.findall(query)
    terms: set[str] = set()
    for word in raw_words:
        # The tokenizer also emits a multi-part identifier whole; coverage counts its parts instead, so that
        # "parse_event" is fully covered by a field that says "parse event". The whole stays when it is
        # all there is ("is_a": both parts are stopwords).
        tokens = _TOKENIZE(word)
        whole = word.lower()
        terms.update([token for token in tokens if token != whole] or tokens)
    parts = [part.lower() for word in raw_words for part in split_identifier(word)]
    words = tuple(_WORD.findall(query.casefold()))
    # Opens on the first word's literal, which the regex engine finds as fast as str.find; the word
    # boundary before it is checked per match (see _contains_phrase).
    phrase = r"\W+".join(re.escape(word) for word in words) + r"(?!\w)"
    # _WORD's words: a leading non-word run skipped, whole words between non-word runs, the last word a prefix.
    opening = r"\W*" + r"\W+".join(re.escape(word) for word in words[:_PREFIX_WORDS])
    return QueryTerms(
        query=query,
        terms=frozenset(terms),
        words=words,
        parts="_" + "_".join(parts) + "_",
        phrase=phrase if len(words) >= 2 else None,
        opening=re.compile(opening) if words else None,
        name=bare_name(query),
    )


def boost(query_terms: QueryTerms, candidate: Candidate, settings: BoostSettings) -> Boost:
    """The multiplier for ``candidate`` (1.0 with no reasons when boosting is off)."""
    return _boost(query_terms, candidate, settings, _weighted_fields(settings))


def _boost(query_terms: QueryTerms, candidate: Candidate, settings: BoostSettings,
           fields: Sequence[tuple[str, float]]) -> Boost:
    """:func:`boost`, with the settings' weighted fields read once by a caller that boosts many candidates."""
    if not settings.enabled:
        return NO_BOOST
    reasons: list[str] = []
    field_factor = _field_factor(query_terms, candidate, fields, reasons)
    exactness = _exactness(query_terms, candidate, settings, reasons)
    tier = definition_tier(query_terms.name, symbols=candidate.symbols, primary_symbol=candidate.primary_symbol,
                           role=candidate.role, settings=settings, reasons=reasons)
    bonus = symbol_bonus(query_terms.parts, symbols=candidate.symbols, primary_symbol=candidate.primary_symbol,
                         role=candidate.role, settings=settings, reasons=reasons)
    return Boost(factor=field_factor * exactness + bonus, reasons=tuple(reasons), tier=tier)


def rerank(
    hits: Sequence[T],
    *,
    query_terms: QueryTerms,
    candidate_of: Callable[[T], Candidate],
    score_of: Callable[[T], float],
    settings: BoostSettings,
) -> list[tuple[T, float, Boost]]:
    """``(hit, score × factor, boost)`` best first: by definition tier, then score; ties keep the input order.
    A hit of a higher tier has the best score of the tiers below added to its own, so scores fall with the
    rank. Scores must not be negative (fused scores never are), or a boost would push a hit down."""
    boosted: list[tuple[T, float, Boost]] = []
    fields = _weighted_fields(settings)
    for hit in hits:
        hit_boost = _boost(query_terms, candidate_of(hit), settings, fields)
        boosted.append((hit, score_of(hit) * hit_boost.factor, hit_boost))
    # sorted() is stable, so equal scores keep their fused order.
    ranked = sorted(boosted, key=lambda entry: (-entry[2].tier, -entry[1]))
    if not ranked or ranked[0][2].tier == 0:
        return ranked
    lifted: list[tuple[T, float, Boost]] = []
    floor = 0.0  # the best (lifted) score of the tiers below the entry being lifted
    for hit, score, hit_boost in reversed(ranked):  # lowest tier first
        if lifted and hit_boost.tier > lifted[-1][2].tier:
            floor = max(entry[1] for entry in lifted)
        lifted.append((hit, score + floor if hit_boost.tier else score, hit_boost))
    return lifted[::-1]


def field_text(candidate: Candidate, field: str) -> str:
    """The text of one boost field of ``candidate`` ("" when it has none); ``field`` is one of ``FIELDS``."""
    return _FIELD_READERS[field](candidate)


def _posix(path: str) -> str:
    return path.replace("\\", "/")


def _metadata_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.replace(",", " ")  # a comma-separated tag string
    if isinstance(value, Sequence | set | frozenset):
        return " ".join(str(item) for item in value)
    return str(value)


def _field_factor(query_terms: QueryTerms, candidate: Candidate, fields: Sequence[tuple[str, float]],
                  reasons: list[str]) -> float:
    if not query_terms.terms:
        return 1.0
    best, best_reason = 1.0, ""
    for field, weight in fields:
        text = field_text(candidate, field)
        if not text or not _may_hold_terms(text, query_terms.terms):
            continue
        covered = query_terms.terms.intersection(_TOKENIZE(text))
        coverage = len(covered) / len(query_terms.terms)
        score = 1.0 + (weight - 1.0) * coverage
        if score > best:  # strictly: on a tie the earlier (heavier by default) field is the reason
            best, best_reason = score, f"{field}:{coverage:.2f}"
    if best_reason:
        reasons.append(best_reason)
    return best


def _weighted_fields(settings: BoostSettings) -> list[tuple[str, float]]:
    """The fields whose weight can raise the factor above 1.0, heaviest (by default) first; a field of
    weight 1.0 or less is never tokenized at all."""
    return [(field, weight) for field in FIELDS if (weight := float(getattr(settings, field))) > 1.0]


def _may_hold_terms(text: str, terms: frozenset[str]) -> bool:
    """False only when no term can be among ``text``'s tokens, which saves tokenizing it.

    Unstemmed tokens of an ASCII text are lower-cased pieces of it, so a term absent from the lower-cased
    text cannot be a token. Other scripts' case mappings can change length, so they are always tokenized.
    """
    if not text.isascii():
        return True
    lowered = text.lower()
    return any(term in lowered for term in terms)


def _exactness(query_terms: QueryTerms, candidate: Candidate, settings: BoostSettings, reasons: list[str]) -> float:
    if not query_terms.words:
        return 1.0
    fields = [
        text.casefold()
        for text in (candidate.text, _metadata_text(candidate.metadata.get("title")), field_text(candidate, "filename"))
        if text
    ]
    if (query_terms.phrase is not None and settings.exact_phrase > 1.0
            and any(_contains_phrase(folded, query_terms) for folded in fields)):
        reasons.append("exact_phrase")
        return settings.exact_phrase
    if settings.prefix > 1.0 and any(_opens_with(folded, query_terms) for folded in fields):
        reasons.append("prefix")
        return settings.prefix
    return 1.0


def _contains_phrase(folded: str, query_terms: QueryTerms) -> bool:
    """Whether the phrase occurs in the case-folded ``folded`` starting at a word boundary ("old chunks" is not
    in "bold chunks")."""
    if query_terms.phrase is None or not all(word in folded for word in query_terms.words):
        return False
    phrase = re.compile(query_terms.phrase)  # the re module keeps it for the query's other candidates
    match = phrase.search(folded)
    while match is not None:
        start = match.start()
        if start == 0 or not _WORD.match(folded, start - 1):
            return True
        match = phrase.search(folded, start + 1)
    return False


def _opens_with(folded: str, query_terms: QueryTerms) -> bool:
    """Whether the case-folded ``folded``'s first words are the query's first ``_PREFIX_WORDS`` (or only)
    words, the last of them possibly unfinished in the text."""
    return query_terms.opening is not None and query_terms.opening.match(folded) is not None
