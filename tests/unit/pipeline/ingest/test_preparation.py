"""From text to the chunks that get embedded: strategy by type, headings and LLM contexts, the entropy
filter and its zone memory, and ``shardfuse explain-chunks``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import fakeredis
import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.chunk_registry import RedisChunkRegistry
from shardfuse.pipeline.core.documents import ContextSource
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers import ChunkBudget, chunk_document, strategy_for
from shardfuse.pipeline.ingest.context.headings import headings_context
from shardfuse.pipeline.ingest.context.llm import ContextOutcome, ContextRequest
from shardfuse.pipeline.ingest.preparation import prepare_chunks
from shardfuse.pipeline.ingest.symbols import NO_SYMBOLS
from shardfuse.workers.cli.main import main
from tests.support.paths import REPO

COUNTER = TokenCounter()
STRATEGIES = Settings().chunking.strategies


def _settings(**sections: dict[str, object]) -> Settings:
    return Settings.model_validate({name: values for name, values in sections.items()})


def test_each_type_gets_its_strategy() -> None:
    assert strategy_for("docs/guide.md", STRATEGIES) == "semantic"
    assert strategy_for("README.RST", STRATEGIES) == "semantic"  # extensions match case-insensitively
    assert strategy_for("pipeline/ingest/chunkers/token_windows.py", STRATEGIES) == "code"
    assert strategy_for("src/lib.rs", STRATEGIES) == "code"
    assert strategy_for("data/table.csv", STRATEGIES) == "semantic"  # anything else: plain text
    assert strategy_for("4983", STRATEGIES) == "semantic"  # no extension
    assert strategy_for("a.py", {"*": "fixed"}) == "fixed"
    with pytest.raises(ValueError, match="unknown chunking strategy 'bogus'"):
        chunk_document("text", path="a.txt", counter=COUNTER, budget=ChunkBudget(), strategies={"*": "bogus"})


def test_chunks_of_a_real_markdown_file_carry_lines_and_heading_paths() -> None:
    text = (REPO / "tests/fixtures/markdown/architecture.md").read_text(encoding="utf-8")
    chunks = chunk_document(text, path="tests/fixtures/markdown/architecture.md", counter=COUNTER,
                            budget=ChunkBudget(256, 32),
                            strategies=STRATEGIES)
    for chunk in chunks:
        assert chunk.text == text[chunk.start_char : chunk.end_char]
        assert chunk.start_line == text.count("\n", 0, chunk.start_char) + 1
        assert chunk.end_line == text.count("\n", 0, chunk.end_char - 1) + 1
        assert chunk.token_count == COUNTER.count(chunk.text) <= 256
        assert chunk.heading_path[0] == "shardfuse architecture (living copy)"
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    shards = next(c for c in chunks if "### How a document's chunks are replaced atomically" in c.text)
    assert shards.heading_path[1:] == ("Shards", "How a document's chunks are replaced atomically")


def test_a_python_function_is_one_chunk_with_its_symbol_and_exact_lines() -> None:
    text = (REPO / "pipeline/ingest/chunkers/token_windows.py").read_text(encoding="utf-8")
    chunks = chunk_document(text, path="pipeline/ingest/chunkers/token_windows.py", counter=COUNTER,
                            budget=ChunkBudget(),
                            strategies=STRATEGIES)
    (defining,) = [c for c in chunks if c.symbols.primary_symbol == "chunk_text"]
    def_line = text[: text.index("def chunk_text(")].count("\n") + 1
    assert defining.start_line <= def_line <= defining.end_line
    assert defining.language == "python" and defining.symbols.role is not None


def test_fixed_windows_do_not_overlap_and_overlapping_ones_do() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8") * 3
    budget = ChunkBudget(64, 16)
    fixed = chunk_document(text, path="x.log", counter=COUNTER, budget=budget, strategies={"*": "fixed"})
    overlapping = chunk_document(text, path="x.log", counter=COUNTER, budget=budget, strategies={"*": "overlapping"})
    assert all(a.end_char <= b.start_char for a, b in zip(fixed, fixed[1:], strict=False))
    assert any(b.start_char < a.end_char for a, b in zip(overlapping, overlapping[1:], strict=False))
    assert len(overlapping) > len(fixed)


def test_headings_context_is_indexed_with_the_chunk_and_keys_its_embedding() -> None:
    text = "# Guide\n\n## Install\n\nRun the installer twice.\n\n" + "Then check the logs twice. " * 120 + "\n"
    prepared = prepare_chunks(text, path="docs/guide.md", doc_hash="h", settings=Settings(), counter=COUNTER)
    first, *_, chunk = prepared.chunks
    assert first.context == "docs/guide.md"  # it opens with both headings: the context does not repeat them
    assert chunk.context == "docs/guide.md — Guide > Install"
    assert chunk.context_source is ContextSource.HEADINGS
    assert chunk.indexed_text == f"{chunk.context}\n\n{chunk.text}"
    assert chunk.embedding_key != chunk.chunk_hash
    bare = prepare_chunks(text, path="docs/guide.md", doc_hash="h", settings=_settings(context={"source": "none"}),
                          counter=COUNTER)
    assert bare.chunks[0].context == "" and bare.chunks[0].embedding_key == bare.chunks[0].chunk_hash


def _paragraphs(*texts: str) -> str:
    return "\n\n".join(texts) + "\n"


PARAGRAPHS = [
    "The ingest stage validates every event, reads the content from the CAS and decodes it into text.",
    "Shard writes replace a document's chunks in one transaction with COPY BINARY and the version rule.",
    "Query workers fan out to every shard, fuse BM25 and vector results with RRF and apply boosts.",
]


def test_the_filter_drops_duplicates_and_counts_them_by_reason() -> None:
    text = _paragraphs(PARAGRAPHS[0], PARAGRAPHS[1], PARAGRAPHS[0], PARAGRAPHS[2])
    settings = _settings(entropy={"enabled": True}, chunking={"max_tokens": 24, "overlap_tokens": 0})
    prepared = prepare_chunks(text, path="notes.txt", doc_hash="h", settings=settings, counter=COUNTER)
    assert prepared.dropped == {"duplicate": 1}
    assert [c.text.strip() for c in prepared.chunks] == [PARAGRAPHS[0], PARAGRAPHS[1], PARAGRAPHS[2]]
    assert [c.ordinal for c in prepared.chunks] == [0, 1, 2]
    assert len(prepared.candidates) == 4 and prepared.verdicts is not None
    off = prepare_chunks(text, path="notes.txt", doc_hash="h", settings=_settings(chunking={"max_tokens": 24,
                         "overlap_tokens": 0}), counter=COUNTER)
    assert len(off.chunks) == 4 and off.dropped == {} and off.verdicts is None


def test_a_chunk_another_document_indexed_first_is_dropped_as_repeated() -> None:
    registry = RedisChunkRegistry(fakeredis.FakeRedis())
    header = "Copyright 2026 Example Corp. Licensed under the Apache License, Version 2.0 (the License)."
    settings = _settings(entropy={"enabled": True}, chunking={"max_tokens": 30, "overlap_tokens": 0})

    def prepare(path: str, body: str) -> list[str]:
        text = _paragraphs(header, body)
        result = prepare_chunks(text, path=path, doc_hash=path, settings=settings, counter=COUNTER,
                                registry=registry, zone="z")
        return [c.text.strip() for c in result.chunks]

    assert prepare("a.txt", PARAGRAPHS[0]) == [header, PARAGRAPHS[0]]
    assert prepare("b.txt", PARAGRAPHS[1]) == [PARAGRAPHS[1]]  # the header is a.txt's
    assert prepare("a.txt", PARAGRAPHS[2]) == [header, PARAGRAPHS[2]]  # a.txt again: its own header
    assert prepare("c.txt", "") == [header]  # a document never loses every chunk


class _Contextualizer:
    """Our contextualizer port: answers for some chunks, fails the others (as the real one reports)."""

    def __init__(self, fail_containing: str) -> None:
        self.fail_containing = fail_containing
        self.seen: list[str] = []

    def contexts(self, document: str, requests: Sequence[ContextRequest], *, doc_hash: str) -> list[ContextOutcome]:
        self.seen.append(doc_hash)
        return [
            ContextOutcome(r.chunk_hash, None, "HTTP 500") if self.fail_containing in r.chunk_text
            else ContextOutcome(r.chunk_hash, f"About {r.chunk_text.split()[1]}.", None)
            for r in requests
        ]


def test_llm_contexts_fall_back_to_headings_and_a_backfill_mark() -> None:
    text = _paragraphs(*PARAGRAPHS)
    settings = _settings(context={"source": "llm"}, chunking={"max_tokens": 24, "overlap_tokens": 0})
    llm = _Contextualizer(fail_containing="Shard writes")
    prepared = prepare_chunks(text, path="notes.txt", doc_hash="sha256:doc", settings=settings, counter=COUNTER,
                              contextualizer=llm)
    sources = [c.context_source for c in prepared.chunks]
    assert sources == [ContextSource.LLM, ContextSource.BACKFILL, ContextSource.LLM]
    assert prepared.chunks[0].context == "About ingest."
    # Its headings context until backfill-context runs: the path and the document's first line, its title.
    assert prepared.chunks[1].context == f"notes.txt — {PARAGRAPHS[0]}"
    assert prepared.backfill == 1 and llm.seen == ["sha256:doc"]
    unreachable = prepare_chunks(text, path="notes.txt", doc_hash="d", settings=settings, counter=COUNTER)
    assert {c.context_source for c in unreachable.chunks} == {ContextSource.BACKFILL}


def test_explain_chunks_shows_each_chunk_with_its_score_and_fate(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "notes.md"
    source.write_text("# Notes\n\n" + _paragraphs(PARAGRAPHS[0], PARAGRAPHS[0], PARAGRAPHS[1]), encoding="utf-8")
    env = {"SHARDFUSE_CHUNKING__MAX_TOKENS": "24", "SHARDFUSE_CHUNKING__OVERLAP_TOKENS": "0",
           "SHARDFUSE_ENTROPY__ENABLED": "true"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        assert main(["explain-chunks", str(source), "--zone", "z", "--as", "docs/notes.md"]) == 0
    out = capsys.readouterr().out
    assert "docs/notes.md in zone z: 3 chunk(s), 2 kept (entropy filter on" in out
    assert "dropped (low_information)" in out and out.count("kept") >= 3  # the heading made #0 differ
    assert "context: docs/notes.md — Notes" in out


@pytest.mark.parametrize(("text", "context"), [
    ("Run the installer twice.", "docs/guide.md — Guide > Install"),
    ("# Guide\n\nRun the installer twice.", "docs/guide.md — Install"),
    ("Guide\n=====\n\nInstall\n-------\n\nRun it.", "docs/guide.md"),
    ("Guidebook: run the installer.", "docs/guide.md — Guide > Install"),  # a word that starts with it is not it
])
def test_a_context_leaves_out_the_headings_its_chunk_opens_with(text: str, context: str) -> None:
    assert headings_context(path="docs/guide.md", heading_path=("Guide", "Install"), symbols=NO_SYMBOLS,
                            language=None, text=text) == context
