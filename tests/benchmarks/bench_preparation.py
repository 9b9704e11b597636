"""The ingest stage's own CPU per chunk, before any broker or database (``make bench``).

``prepare_chunks`` — chunking (with its token counting), the entropy-aware filter and the headings context —
is the ingest pool's largest cost (docs/performance.md, session 19's profile: tiktoken ~30 % of it). Here it
runs in this process on one core over two corpora: ``DOCS`` of the benchmarks' SciFact-made documents (plain
text, the semantic chunker) and every non-empty Python file of the installed Celery (the code chunker), with the
settings of the benchmark stacks (``hashing`` embedder: no model input limit to fit) and with the default local
model's limit (``chunking.fit_embedder`` chunks a document again when a chunk would overflow the model;
counting in the model's tokenizer). Time is this process's CPU time, the best of ``ROUNDS``; nothing is
asserted but that every document gives chunks. The last line is JSON.
"""

from __future__ import annotations

import time
from pathlib import Path

import celery

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.preparation import prepare_chunks
from tests.benchmarks.scale import corpus, report

DOCS = 3000
ROUNDS = 3
PROVIDERS = ("hashing", "local")


def _documents() -> dict[str, list[tuple[str, str]]]:
    code = sorted(Path(celery.__file__).parent.rglob("*.py"))
    return {"scifact": [(d.path, d.text) for d in corpus(DOCS)],
            "celery": [(str(p), text) for p in code if (text := p.read_text(encoding="utf-8")).strip()]}


def _cpu_per_chunk(documents: list[tuple[str, str]], settings: Settings) -> tuple[float, int]:
    """The best of ``ROUNDS`` CPU times to prepare ``documents`` (seconds), and the chunks they gave."""
    counter = TokenCounter(settings.chunking.encoding)
    best, chunks = float("inf"), 0
    for _ in range(ROUNDS):
        started, chunks = time.process_time(), 0
        for path, text in documents:
            prepared = prepare_chunks(text, path=path, doc_hash="sha256:" + "0" * 64, settings=settings,
                                      counter=counter, zone="bench")
            assert prepared.chunks, path
            chunks += len(prepared.chunks)
        best = min(best, time.process_time() - started)
    return best, chunks


def test_ingest_preparation_cpu_per_chunk() -> None:
    rows, figures = [], {}
    for provider in PROVIDERS:
        settings = Settings.model_validate({"embedder": {"provider": provider}})
        for name, documents in _documents().items():
            seconds, chunks = _cpu_per_chunk(documents, settings)
            ms = seconds / chunks * 1000
            rows.append([provider, name, len(documents), chunks, round(seconds, 2), round(ms, 3)])
            figures[f"{provider}_{name}_ms_per_chunk"] = round(ms, 4)
    report("preparation", ["embedder settings", "corpus", "documents", "chunks", "CPU s", "CPU ms / chunk"],
           rows, {"rounds": ROUNDS, **figures})
