"""One side of :mod:`tests.benchmarks.parts_ab`: the CPU-bound parts of an ingest timed in this process with
whichever ``shardfuse`` package is first on ``sys.path``, on SciFact's abstracts, celery's source, the code
fixtures and each hostile-chunking family held to its goal (tests/support/hostile_text.py). Prints
one JSON line: each part's best-of-``--rounds`` CPU seconds (this thread's) and a digest of what it produced,
so two revisions can be held to the same output.

    python -m tests.benchmarks.parts_ab_side --root DIR [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCIFACT = Path(__file__).resolve().parents[3] / "shared" / "data" / "scifact" / "corpus.jsonl"  # as scale.DATA
ABSTRACTS = 5_000
CHUNKED = 3_000
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "code"  # brace languages and Python
HOSTILE_CHARS = 250_000  # a quarter of the benchmark's megabyte a family


def _best(work: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    """The least CPU seconds of this thread over ``rounds`` runs of ``work``, and its last result."""
    best, result = float("inf"), None
    for _ in range(rounds):
        began = time.thread_time()
        result = work()
        best = min(best, time.thread_time() - began)
    return round(best, 4), result


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="the package directory that must be imported")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    import celery

    import shardfuse

    imported = Path(shardfuse.__file__).resolve().parent
    if imported != args.root.resolve():
        print(f"parts_ab_side: imported shardfuse from {imported}, not {args.root}", file=sys.stderr)
        return 2
    from shardfuse.pipeline.core.token_counting import TokenCounter
    from shardfuse.pipeline.embed.providers import HashingEmbedder
    from shardfuse.pipeline.index.lexical import Tokenizer
    from shardfuse.pipeline.ingest.chunkers import chunk_document
    from tests.support.hostile_text import BUDGET, FAMILIES, STRATEGIES, VOLUME

    records = [json.loads(line) for line in SCIFACT.read_text(encoding="utf-8").splitlines()[:ABSTRACTS]]
    abstracts = [f"{r['title']}\n\n{r['text']}" for r in records]
    celery_files = sorted(Path(celery.__file__).parent.rglob("*.py"))
    source = [p.read_text(encoding="utf-8", errors="replace") for p in celery_files]
    figures: dict[str, Any] = {}
    for name, texts in (("tokenizer_scifact", abstracts), ("tokenizer_celery", source)):
        tokenizer = Tokenizer()
        figures[name + "_s"], tokens = _best(lambda t=tokenizer, x=texts: [t(text) for text in x], args.rounds)
        figures[name + "_digest"] = _digest(tokens)
    cut = [text[:1500] for text in abstracts]  # about a chunk each
    for size in (8, 64, 256):
        embedder = HashingEmbedder(384)
        batches = [cut[i:i + size] for i in range(0, len(cut), size)]
        figures[f"hashing_batch_{size}_s"], vectors = _best(
            lambda e=embedder, b=batches: [e.embed_documents(batch).tobytes() for batch in b], args.rounds)
        figures[f"hashing_batch_{size}_digest"] = _digest(vectors)
    counter = TokenCounter()
    figures["semantic_scifact_s"], chunks = _best(
        lambda: [chunk_document(text, path="abstract.md", counter=counter, budget=BUDGET, strategies=STRATEGIES)
                 for text in abstracts[:CHUNKED]], args.rounds)
    figures["semantic_scifact_digest"] = _digest(chunks)
    code = [(p.name, p.read_text(encoding="utf-8")) for p in sorted(FIXTURES.iterdir()) if p.is_file()]
    code += [(p.name, text) for p, text in zip(celery_files, source, strict=True)]
    figures["code_s"], chunks = _best(
        lambda: [chunk_document(text, path=name, counter=counter, budget=BUDGET, strategies=STRATEGIES)
                 for name, text in code], args.rounds)
    figures["code_digest"] = _digest(chunks)
    for family, (_, path, build) in FAMILIES.items():
        if family in VOLUME:
            continue
        part = "hostile_" + re.sub(r"\W+", "_", family.replace("c++", "cpp")).strip("_")
        text = build(HOSTILE_CHARS)
        figures[part + "_s"], chunks = _best(
            lambda t=text, p=path: chunk_document(t, path=p, counter=counter, budget=BUDGET, strategies=STRATEGIES),
            args.rounds)
        figures[part + "_digest"] = _digest(chunks)
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
