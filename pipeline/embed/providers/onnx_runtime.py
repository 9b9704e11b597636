"""Run a sentence-transformers model's transformer through ONNX Runtime instead of torch.

For one short query, torch's per-operator dispatch dominates: all-MiniLM-L6-v2 takes ~16 ms per query on
two cores, the same graph in ONNX Runtime ~5 ms, with vectors equal to within 1e-6. The graph is exported
from the already-loaded torch model on first use (no download), optimised, and for ``precision="int8"``
quantised, each once, into ``cache_dir`` (:mod:`~shardfuse.pipeline.embed.providers.onnx_graphs`). Only the
transformer runs in ONNX; tokenisation, mean or CLS pooling and normalisation stay here, so this covers models
whose pipeline is ``Transformer → Pooling (→ Normalize)``.

Texts are tokenised once, all together, and run in batches of similar length
(:mod:`~shardfuse.pipeline.embed.providers.length_buckets`): a batch is padded to its longest input only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.embed.providers.length_buckets import in_input_order, length_batches
from shardfuse.pipeline.embed.providers.onnx_graphs import INPUTS, model_graph

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Encoding

log = logging.getLogger(__name__)


class UnsupportedModelError(Exception):
    """The model's pipeline is not one this runner reproduces; the caller keeps torch."""


class OnnxEncoder:
    """Encodes texts like ``SentenceTransformer.encode(normalize_embeddings=True)``, through ONNX Runtime.

    One session per process, shared by every thread that encodes (ONNX Runtime's ``run`` is thread-safe;
    concurrent runs share the session's ``threads`` intra-op threads instead of each starting its own)."""

    def __init__(self, model: SentenceTransformer, *, source: str, cache_dir: Path, threads: int = 0,
                 precision: str = "fp32") -> None:
        import onnxruntime as ort  # optional dependency (the ``local`` extra)
        from tokenizers import Tokenizer

        backend = getattr(model.tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise UnsupportedModelError("the model has no fast (Rust) tokenizer")
        self._max_length = int(model.max_seq_length or 512)
        # A copy: the transformers wrapper changes its backend's truncation and padding per call.
        self._tokenizer = Tokenizer.from_str(backend.to_str())
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(self._max_length)
        self._pad_id = int(model.tokenizer.pad_token_id or 0)
        self._pooling = _pooling_mode(model)
        path = model_graph(model, source=source, cache_dir=cache_dir, precision=precision)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # No busy-waiting between operators: the pool's cores are shared with ingest, PostgreSQL and the other
        # pools, and a spinning thread takes a core from them for nothing (SciFact chunks on the shared 2-core
        # machine: 19-30 % more chunks per CPU-second with spinning off).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._input_names = {i.name for i in self._session.get_inputs()}

    def encode(self, texts: Sequence[str], *, batch_size: int) -> npt.NDArray[np.float32]:
        encodings = self._tokenizer.encode_batch(list(texts))
        batches = length_batches([len(e.ids) for e in encodings], batch_size)
        rows = [self._forward([encodings[i] for i in batch]) for batch in batches]
        vectors = in_input_order(rows, batches)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit: npt.NDArray[np.float32] = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
        return unit

    def _forward(self, encodings: Sequence[Encoding]) -> npt.NDArray[np.float32]:
        """The pooled rows of one batch, padded to its longest input."""
        longest = max(len(e.ids) for e in encodings)
        arrays = {
            "input_ids": np.full((len(encodings), longest), self._pad_id, dtype=np.int64),
            "attention_mask": np.zeros((len(encodings), longest), dtype=np.int64),
            "token_type_ids": np.zeros((len(encodings), longest), dtype=np.int64),
        }
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            arrays["input_ids"][row, :n] = encoding.ids
            arrays["attention_mask"][row, :n] = encoding.attention_mask
            arrays["token_type_ids"][row, :n] = encoding.type_ids
        feeds = {name: arrays[name] for name in INPUTS if name in self._input_names}
        hidden = self._session.run(None, feeds)[0]
        return _pool(hidden, arrays["attention_mask"], self._pooling)


def _pooling_mode(model: SentenceTransformer) -> str:
    modules = list(model)
    names = [type(m).__name__ for m in modules]
    if names[:2] != ["Transformer", "Pooling"] or any(n not in {"Normalize"} for n in names[2:]):
        raise UnsupportedModelError(f"pipeline {names} is not Transformer → Pooling (→ Normalize)")
    config = modules[1].get_config_dict()  # type: ignore[operator]
    # sentence-transformers ≥ 5 names the mode; older versions set one flag per mode.
    mode = config.get("pooling_mode")
    if mode == "mean" or config.get("pooling_mode_mean_tokens"):
        return "mean"
    if mode == "cls" or config.get("pooling_mode_cls_token"):
        return "cls"
    raise UnsupportedModelError(f"pooling {config} is neither mean nor CLS")


def _pool(hidden: npt.NDArray[Any], mask: npt.NDArray[Any], mode: str) -> npt.NDArray[np.float32]:
    if mode == "cls":
        return np.asarray(hidden[:, 0], dtype=np.float32)
    weights = mask[..., None].astype(np.float32)
    summed = (hidden * weights).sum(axis=1)
    return np.asarray(summed / np.maximum(weights.sum(axis=1), 1e-9), dtype=np.float32)
