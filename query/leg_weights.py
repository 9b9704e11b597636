"""The fusion weight of each leg of a search (pure): the router's lean for the keyword and vector legs, the
configured weight of the grep leg, and a smaller share for the extra legs of a query expansion."""

from __future__ import annotations

from collections.abc import Mapping

from shardfuse.query.fusion import KEYWORD, VECTOR
from shardfuse.query.grep.service import GREP
from shardfuse.query.router import Route

# An expansion leg counts this much of the leg it extends, shared among that kind's expansion legs: the
# original query stays the strongest evidence.
EXPANSION_SHARE = 0.5


def leg_weights(legs: Mapping[str, object], plan: Route, *, grep_weight: float = 1.0) -> dict[str, float]:
    """The router's lean per kind of leg; expansion legs share ``EXPANSION_SHARE`` of their kind's weight."""
    lean = {KEYWORD: plan.keyword_weight, VECTOR: plan.vector_weight, GREP: grep_weight}
    extra = {kind: sum(1 for name in legs if name.startswith(kind + "+")) for kind in lean}
    weights: dict[str, float] = {}
    for name in legs:
        kind = name.split("+", 1)[0]
        weights[name] = lean[kind] if name == kind else lean[kind] * EXPANSION_SHARE / extra[kind]
    return weights
