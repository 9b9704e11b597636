"""Scoring a code-search evaluation, as pure functions over search answers' results.

A result *holds* a definition when it is a chunk of the same document whose line range (1-based, inclusive)
contains the definition's ``def``/``class`` line: the chunk a person jumping to the definition wants. A name
case is found when such a chunk is ranked first (``NAME_TOP``), a docstring case when one is in the top
``DOC_TOP``; each kind's share found is compared with its target (``TARGETS``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardfuse.query.evaluation.code_sampling import CodeCase, CodeDefinition

NAME_TOP = 1
DOC_TOP = 5
# What each kind of query must find, and the share of cases that must find it.
TOPS: Mapping[str, int] = {"name": NAME_TOP, "docstring": DOC_TOP}
TARGETS: Mapping[str, float] = {"name": 0.90, "docstring": 0.80}
SHOWN_PER_MISS = 3  # results listed under each miss


@dataclass(frozen=True, slots=True)
class Outcome:
    """One case's result: the rank of the first chunk holding the target (None when none was returned)."""

    case: CodeCase
    rank: int | None
    top: tuple[Mapping[str, Any], ...] = ()  # the first results, to show why a miss missed

    @property
    def found(self) -> bool:
        return self.rank is not None and self.rank <= TOPS[self.case.kind]


def holds(result: Mapping[str, Any], target: CodeDefinition) -> bool:
    """Whether the search result ``result`` is a chunk holding ``target``'s definition line."""
    return (
        result.get("path") == target.path
        and int(result.get("start_line", 0)) <= target.line <= int(result.get("end_line", -1))
    )


def outcome(case: CodeCase, results: Sequence[Mapping[str, Any]]) -> Outcome:
    """Where ``case``'s target is among ``results`` (best first)."""
    rank = next((i for i, result in enumerate(results, start=1) if holds(result, case.target)), None)
    return Outcome(case=case, rank=rank, top=tuple(results[:SHOWN_PER_MISS]))


def summarize(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Per kind of case: how many, the share found within its top (``hit@N``), the share at rank 1, MRR@10,
    the target and whether it is met."""
    summary: dict[str, dict[str, Any]] = {}
    for kind, top in TOPS.items():
        mine = [o for o in outcomes if o.case.kind == kind]
        if not mine:
            continue
        share = sum(o.found for o in mine) / len(mine)
        summary[kind] = {
            "cases": len(mine),
            f"hit@{top}": round(share, 4),
            "hit@1": round(sum(o.rank == 1 for o in mine) / len(mine), 4),
            "hit@5": round(sum(o.rank is not None and o.rank <= 5 for o in mine) / len(mine), 4),
            "mrr@10": round(sum(1 / o.rank for o in mine if o.rank is not None and o.rank <= 10) / len(mine), 4),
            "target": TARGETS[kind],
            "passed": share >= TARGETS[kind],
        }
    return summary


def format_table(summary: Mapping[str, Mapping[str, Any]], *, title: str) -> str:
    """The summary as a fixed-width table under ``title``."""
    columns = ["cases", "hit@1", "hit@5", "mrr@10", "target", "passed"]
    lines = [title, f"{'query':<28}" + "".join(f"{c:>9}" for c in columns)]
    for kind, row in summary.items():
        label = f"{kind} (found: top {TOPS[kind]})"
        lines.append(f"{label:<28}" + "".join(f"{_cell(row[c]):>9}" for c in columns))
    return "\n".join(lines)


def format_misses(outcomes: Sequence[Outcome]) -> str:
    """Each case not found: the query, where its target is, its rank if returned at all, and what came first."""
    lines: list[str] = []
    for miss in (o for o in outcomes if not o.found):
        target = miss.case.target
        where = f"rank {miss.rank}" if miss.rank is not None else "not returned"
        lines.append(f"[{miss.case.kind}] {miss.case.query!r} → {target.kind} {target.qualified} "
                     f"at {target.path}:{target.line} ({where})")
        for i, result in enumerate(miss.top, start=1):
            symbol = result.get("primary_symbol") or "-"
            reasons = ",".join(result.get("boost_reasons") or ()) or "-"
            lines.append(f"    {i}. {result.get('path')}:{result.get('start_line')}-{result.get('end_line')} "
                         f"{result.get('role') or '-'} {symbol} score={_cell(result.get('score'))} "
                         f"boost={reasons}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.4f}" if value < 10 else f"{value:.1f}"
    return str(value)
