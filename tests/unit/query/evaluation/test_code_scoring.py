from __future__ import annotations

from typing import Any

from shardfuse.query.evaluation.code_sampling import CodeCase, CodeDefinition
from shardfuse.query.evaluation.code_scoring import format_misses, format_table, holds, outcome, summarize

TARGET = CodeDefinition(path="pkg/bus.py", name="publish", qualified="Bus.publish", kind="method", line=40,
                        end_line=52, summary="Send a message.")


def result(path: str, start: int, end: int, **extra: Any) -> dict[str, Any]:
    return {"path": path, "start_line": start, "end_line": end, **extra}


def test_a_chunk_holds_a_definition_when_its_lines_contain_the_def_line_of_the_same_file() -> None:
    assert holds(result("pkg/bus.py", 30, 45), TARGET)
    assert holds(result("pkg/bus.py", 40, 40), TARGET)
    assert not holds(result("pkg/bus.py", 41, 60), TARGET)  # the body only
    assert not holds(result("pkg/other.py", 1, 100), TARGET)


def test_name_cases_count_only_rank_one_and_docstring_cases_the_top_five() -> None:
    name = CodeCase("name", "publish", TARGET)
    doc = CodeCase("docstring", "Send a message.", TARGET)
    elsewhere = [result(f"pkg/m{i}.py", 1, 10) for i in range(6)]
    right = result("pkg/bus.py", 35, 52, primary_symbol="Bus")
    outcomes = [
        outcome(name, [right, *elsewhere]),  # found
        outcome(name, [elsewhere[0], right]),  # rank 2: a miss for a name
        outcome(doc, [*elsewhere[:4], right]),  # rank 5: found for a docstring
        outcome(doc, [*elsewhere, right]),  # rank 7: a miss
        outcome(doc, elsewhere),  # not returned
    ]
    assert [o.found for o in outcomes] == [True, False, True, False, False]
    assert [o.rank for o in outcomes] == [1, 2, 5, 7, None]
    summary = summarize(outcomes)
    assert summary["name"]["cases"] == 2
    assert summary["name"]["hit@1"] == 0.5
    assert summary["name"]["hit@5"] == 1.0
    assert summary["name"]["passed"] is False
    assert summary["docstring"]["hit@5"] == round(1 / 3, 4)
    assert summary["docstring"]["mrr@10"] == round((1 / 5 + 1 / 7) / 3, 4)
    table = format_table(summary, title="t")
    assert "name (found: top 1)" in table and "docstring (found: top 5)" in table
    misses = format_misses(outcomes)
    assert "'publish' → method Bus.publish at pkg/bus.py:40 (rank 2)" in misses
    assert "(not returned)" in misses
    assert "1. pkg/m0.py:1-10" in misses
