"""Every chunk's ``token_count`` is its own text's count, whichever strategy cut it.

Strategies hand their exact counts to ``materialize`` (``Span.tokens``) instead of encoding each chunk again:
the semantic chunker sums its pieces' counts where no token crosses a joint, the code chunker reuses the
ranges it counted while packing, the token windows their own counts. The embedder's input limit and the
statistics read ``token_count``; a sum that is off by one would pass a chunk the model then truncates. So
this checks the counts against ``TokenCounter.count`` on real files of several kinds (this repository, the
installed Celery and Flower: Python, Markdown, reStructuredText, HTML, JavaScript, CSS) and on the hostile
families, at the default budget and at a small one that cuts far more often.
"""

from __future__ import annotations

import random
from pathlib import Path

import celery
import flower
import pytest

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers import ChunkBudget, chunk_document
from shardfuse.pipeline.ingest.chunkers.semantic import semantic_spans
from tests.support.hostile_text import FAMILIES, STRATEGIES
from tests.support.paths import REPO

KINDS = (".py", ".md", ".rst", ".html", ".js", ".css", ".txt", ".toml", ".yml")
FILES_PER_KIND = 12
BUDGETS = (ChunkBudget(max_tokens=512, overlap_tokens=64), ChunkBudget(max_tokens=48, overlap_tokens=8))


def _files() -> list[Path]:
    roots = [REPO / "pipeline", REPO / "docs", REPO / "config", REPO / "k8s", Path(celery.__file__).parent,
             Path(flower.__file__).parent]
    chosen: list[Path] = [REPO / "README.md"]
    for kind in KINDS:
        found = sorted(p for root in roots for p in root.rglob(f"*{kind}") if p.is_file())
        # The largest files of each kind: they hold the most cuts.
        chosen.extend(sorted(found, key=lambda p: -p.stat().st_size)[:FILES_PER_KIND])
    return chosen


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.mark.parametrize("budget", BUDGETS, ids=lambda b: f"max{b.max_tokens}")
def test_every_chunk_of_real_files_counts_its_own_text(counter: TokenCounter, budget: ChunkBudget) -> None:
    files = _files()
    assert len({p.suffix for p in files}) >= 7, "too few kinds of files to check"
    checked = 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for chunk in chunk_document(text, path=path.name, counter=counter, budget=budget, strategies=STRATEGIES):
            assert chunk.token_count == counter.count(chunk.text), f"{path} chunk {chunk.ordinal}"
            checked += 1
    assert checked > len(files)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_chunk_of_hostile_text_counts_its_own_text(counter: TokenCounter, family: str) -> None:
    _, path, build = FAMILIES[family]
    for budget in BUDGETS:
        chunks = chunk_document(build(6_000), path=path, counter=counter, budget=budget, strategies=STRATEGIES)
        assert chunks
        assert [c.token_count for c in chunks] == [counter.count(c.text) for c in chunks]


def test_sentences_joined_inside_a_line_are_counted_whole(counter: TokenCounter) -> None:
    # A line over the budget is cut at sentence ends, and its sentences joined again: there a token crosses
    # each joint (" Alpha" is one token, " " + "Alpha" two), so the pieces' counts do not add up. Such a span
    # carries no count, and its chunk is counted on its own text.
    rng = random.Random(18)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))).capitalize() + "." for _ in range(40)]
    text = "# Title\n\n" + " ".join(sentences) + "\n\nNext paragraph.\n"
    budget = ChunkBudget(max_tokens=48, overlap_tokens=4)
    spans = semantic_spans(text, fmt="markdown", counter=counter, budget=budget)
    assert any(s.tokens is None for s in spans), "no span joined sentences inside a line"
    chunks = chunk_document(text, path="notes.md", counter=counter, budget=budget, strategies=STRATEGIES)
    assert [c.token_count for c in chunks] == [counter.count(c.text) for c in chunks]
