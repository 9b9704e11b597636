"""What a chunk defines, against what the query names: the symbol part of :mod:`shardfuse.query.boosts`.

Two signals, both pure functions of the query and the chunk's symbols (``symbols``: every definition whose
header line is in the chunk; ``primary_symbol``: its first top-level one, or for a piece of a split
definition, that definition; ``role``: complete, declaration, body or mixed):

- **definition tier** (:func:`definition_tier`), for a query that *is* a name — one identifier, possibly
  dotted (``Task.apply_async``, the last segment counts) or called (``apply_async()``). A bare name asks
  where something is defined, so the chunks holding its definition come before every chunk that merely
  uses it, however often the others use it (BM25 and the vector leg rank heavy users as high or higher, and
  min-max fusion can leave the definition's fused score near 0, where no multiplier would lift it). Tiers,
  best first: a chunk whose ``symbols`` hold the name whole (``listen`` is not ``_listen``) in the query's
  case — it holds the definition's header; the same in another case (``Request`` for "request"); a piece
  of a split definition of that name that does not hold its header (``role = body``), in the query's case,
  then in another; everything else (tier 0). Within a tier the boosted score decides.
- **symbol bonus** (:func:`symbol_bonus`), for any query: ``+ primary_symbol`` when the chunk's primary
  symbol matches the query, else ``+ any_symbol`` when any of its symbols does; then ``+ complete_role`` /
  ``+ declaration_role`` for the chunk's role, only when a symbol matched. A symbol matches when its
  identifier parts (split at ``snake_case`` and ``camelCase`` like the lexical tokenizer does, lower-cased,
  the last ``.`` segment of a qualified name) occur as a contiguous run of the query's parts. So
  ``parse_event``, ``parseEvent`` and ``ParseEvent`` all match each other and the query "how do we parse
  event payloads"; ``event`` matches any query with the word "event"; a symbol whose parts are all
  stopwords never matches.

So for a bare name the order is: its definition (a complete one before a declaration when two chunks define
the name, by the role bonuses), the rest of its body, mere use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from shardfuse.pipeline.config.settings import BoostSettings
from shardfuse.pipeline.index.lexical.tokenizer import STOPWORDS, split_identifier

# The definition tiers of a chunk for a bare-name query (0: it does not define the name).
DEFINES, DEFINES_OTHER_CASE, BODY_OF, BODY_OF_OTHER_CASE = 4, 3, 2, 1
# One identifier, possibly qualified with dots and followed by an empty call: the whole query is a name.
_BARE_NAME = re.compile(r"\s*(?:[^\W\d]\w*\.)*(?P<name>[^\W\d]\w*)(?:\(\))?\s*")
_ROLE_BONUSES: Mapping[str, Callable[[BoostSettings], float]] = MappingProxyType({
    "complete": lambda s: s.complete_role,
    "declaration": lambda s: s.declaration_role,
})


def bare_name(query: str) -> str | None:
    """The name ``query`` consists of (the last segment of a dotted name, without ``()``), or None when the
    query is anything more than one name."""
    match = _BARE_NAME.fullmatch(query)
    return match["name"] if match else None


def definition_tier(
    name: str | None, *, symbols: Sequence[str], primary_symbol: str | None, role: str | None,
    settings: BoostSettings, reasons: list[str],
) -> int:
    """How surely a chunk holds the definition of the name the query is (see the module docstring); 0 when
    the query is not a name, the chunk does not define it, or ``definitions_first`` is off."""
    if name is None or not settings.definitions_first:
        return 0
    matches = [same for symbol in symbols if (same := _same_name(name, symbol)) is not None]
    if matches:
        reasons.append(f"defines:{name}")
        return DEFINES if any(matches) else DEFINES_OTHER_CASE
    if role == "body" and primary_symbol is not None and (same := _same_name(name, primary_symbol)) is not None:
        reasons.append(f"inside:{name}")
        return BODY_OF if same else BODY_OF_OTHER_CASE
    return 0


def symbol_bonus(
    query_parts: str, *, symbols: Sequence[str], primary_symbol: str | None, role: str | None,
    settings: BoostSettings, reasons: list[str],
) -> float:
    """The additive bonus for a chunk defining a symbol the query mentions; ``query_parts`` is ``"_"`` + the
    query's lower-cased identifier parts joined by ``"_"`` + ``"_"``."""
    bonus = 0.0
    if primary_symbol and symbol_matches(primary_symbol, query_parts):
        bonus += settings.primary_symbol
        reasons.append(f"primary_symbol:{primary_symbol}")
    else:
        matched = next((s for s in symbols if symbol_matches(s, query_parts)), None)
        if matched is None:
            return 0.0  # roles count only for a chunk that defines what the query names
        bonus += settings.any_symbol
        reasons.append(f"any_symbol:{matched}")
    role_bonus = _role_bonus(role, settings)
    if role_bonus:
        bonus += role_bonus
        reasons.append(f"{role}_role")
    return bonus


def symbol_matches(symbol: str, query_parts: str) -> bool:
    """Whether ``symbol``'s identifier parts occur as a contiguous run of the query's (see the module docs)."""
    parts = [part.lower() for part in split_identifier(_last_segment(symbol))]
    if not parts or all(part in STOPWORDS or len(part) < 2 for part in parts):
        return False
    return "_" + "_".join(parts) + "_" in query_parts


def _same_name(name: str, symbol: str) -> bool | None:
    """True when ``symbol`` is ``name``, False when it is in another case only, None when it is another name."""
    defined = _last_segment(symbol)
    if defined == name:
        return True
    return False if defined.casefold() == name.casefold() else None


def _last_segment(symbol: str) -> str:
    return symbol.rsplit(".", 1)[-1]  # "SearchService.search" is defined as "search"


def _role_bonus(role: str | None, settings: BoostSettings) -> float:
    reader = _ROLE_BONUSES.get(role or "")
    return reader(settings) if reader else 0.0
