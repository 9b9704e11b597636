"""The int8 local model (``embedder.local_precision = "int8"``): the real all-MiniLM-L6-v2, quantised once
on disk, embeds like fp32 (cosine ≥ 0.98 per text) under a name of its own, so no cache mixes the two."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardfuse.pipeline.config.settings import EmbedderSettings
from shardfuse.pipeline.embed.providers import build_embedder

TEXTS = [
    "How are a document's old chunks replaced atomically?",
    "Reciprocal rank fusion merges the keyword and vector result lists.",
    "def parse_event(raw: bytes) -> WriteEvent: validate the JSON at the edge",
    "Vitamin D deficiency is associated with an increased risk of respiratory infections in children.",
    "gitignore",
    "Reset a user's password from the admin page.",
]


@pytest.mark.timeout(600)
def test_int8_vectors_match_fp32_under_a_distinct_name(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("onnxruntime.quantization")
    fp32 = build_embedder(EmbedderSettings(), models_dir=tmp_path)
    int8 = build_embedder(EmbedderSettings(local_precision="int8"), models_dir=tmp_path)

    assert int8.name == "local:all-MiniLM-L6-v2@int8" and fp32.name == "local:all-MiniLM-L6-v2"
    assert len(list(tmp_path.glob("*.int8.onnx"))) == 1 and not list(tmp_path.glob("*.tmp*"))
    full, quantised = fp32.embed_documents(TEXTS), int8.embed_documents(TEXTS)
    assert quantised.shape == (len(TEXTS), 384) and quantised.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(quantised, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(full * quantised, axis=1)
    assert cosines.min() >= 0.98, cosines
    # Still the same ranking on what the model is for: the query's nearest text is the same.
    query = int8.embed_query("replace old chunks of a document in one transaction")
    assert int(np.argmax(quantised @ query)) == int(np.argmax(full @ fp32.embed_query(
        "replace old chunks of a document in one transaction"))) == 0
