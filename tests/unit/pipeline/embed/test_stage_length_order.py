"""An in-process model's requests are cut from the flush sorted by length; a remote provider's keep arrival order.
Either way every chunk gets its own vector."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardfuse.pipeline.embed.providers.base import Vectors
from shardfuse.pipeline.embed.providers.input_limits import ProviderLimits
from shardfuse.pipeline.embed.stage import EmbeddingStage

_MANY = 10**9


class _WordModel:
    """A stand-in model (the stage is under test): one word = one token; its vector encodes the text's words."""

    def __init__(self, *, length_sorted: bool) -> None:
        self.limits = ProviderLimits(max_inputs_per_request=_MANY, max_tokens_per_request=_MANY,
                                     max_tokens_per_input=1000, default_batch_size=2, length_sorted=length_sorted)
        self.requests: list[list[str]] = []

    @property
    def name(self) -> str:
        return "fake:words"

    @property
    def dimensions(self) -> int:
        return 2

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        self.requests.append(list(texts))
        rows = np.array([[len(t.split()), 1.0 + sum(map(ord, t)) % 97] for t in texts], dtype=np.float32)
        norms: Vectors = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        return norms

    def embed_query(self, text: str) -> Vectors:
        return self.embed_documents([text])[0]


TEXTS = {"long": "w " * 40, "short": "tiny", "mid": "w " * 12, "shortish": "two words", "longer": "w " * 60}


def test_an_in_process_model_gets_requests_of_similar_lengths() -> None:
    model = _WordModel(length_sorted=True)
    result = EmbeddingStage(embedder=model, batch_size=2).embed(TEXTS)
    assert [[len(t.split()) for t in request] for request in model.requests] == [[1, 2], [12, 40], [60]]
    reference = {h: model.embed_documents([t])[0] for h, t in TEXTS.items()}
    for chunk_hash, vector in result.vectors.items():
        np.testing.assert_allclose(vector, reference[chunk_hash])
    assert set(result.vectors) == set(TEXTS) and not result.failed


def test_a_remote_provider_keeps_arrival_order() -> None:
    model = _WordModel(length_sorted=False)
    EmbeddingStage(embedder=model, batch_size=2).embed(TEXTS)
    assert [t for request in model.requests for t in request] == list(TEXTS.values())
