"""The local model's ONNX graphs on disk, each made once and reused: exported, optimised, quantised.

1. **exported**: the transformer of the loaded sentence-transformers model, traced by ``torch.onnx`` (no
   download), keyed by the model directory and the torch/transformers versions;
2. **quantised** (``embedder.local_precision = "int8"``): the exported graph with its weights quantised to
   int8 and activations quantised per batch at run time (``onnxruntime.quantization.quantize_dynamic``; it
   quantises plain ONNX MatMuls, so it runs before ONNX Runtime fuses them into its own operators);
3. **optimised**: the graph to load (exported or quantised) after ONNX Runtime's graph optimisations
   (constant folding, and the fusions of the extended level: GELU, LayerNorm, attention), saved by ONNX
   Runtime itself (``SessionOptions.optimized_model_filepath``), keyed by the onnxruntime version. The
   extended level is what is saved because it stays portable; the hardware-specific layout passes of
   ``ORT_ENABLE_ALL`` run each time a session loads the file (cheap).

All live in ``cache_dir`` (``<data_dir>/models``). Each is written to a temporary file and renamed, so
workers starting together never read a half-written graph (the loser of a race repeats the work once).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_OPSET = 17


def model_graph(model: SentenceTransformer, *, source: str, cache_dir: Path, precision: str) -> Path:
    """The graph a session should load for ``precision`` ("fp32" or "int8"), made on first use."""
    exported = exported_graph(model, source=source, cache_dir=cache_dir)
    return optimised_graph(quantised_graph(exported) if precision == "int8" else exported)


def exported_graph(model: SentenceTransformer, *, source: str, cache_dir: Path) -> Path:
    """The model's transformer as an ONNX graph (inputs :data:`INPUTS`, output the last hidden state)."""
    import torch
    import transformers

    key = hashlib.sha256(json.dumps(
        [os.path.abspath(source) if os.path.exists(source) else source, torch.__version__,
         transformers.__version__, _OPSET]
    ).encode()).hexdigest()[:16]
    path = cache_dir / f"{Path(source).name}-{key}.onnx"
    if not path.is_file():
        log.info("exporting %s to ONNX at %s (once per model and library version)", source, path)
        _write_once(path, lambda target: _export(model, target))
    return path


def optimised_graph(graph: Path) -> Path:
    """``graph`` after ONNX Runtime's extended graph optimisations, saved beside it."""
    import onnxruntime as ort

    path = graph.with_name(f"{graph.stem}.ort{ort.__version__}.opt.onnx")
    if not path.is_file():
        log.info("optimising %s for ONNX Runtime %s (once)", graph.name, ort.__version__)

        def optimise(target: Path) -> None:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
            options.optimized_model_filepath = str(target)
            options.log_severity_level = 3
            ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])

        _write_once(path, optimise)
    return path


def quantised_graph(exported: Path) -> Path:
    """``exported`` with int8 weights and dynamically quantised activations, saved beside it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = exported.with_name(f"{exported.stem}.int8.onnx")
    if not path.is_file():
        log.info("quantising %s to int8 (once)", exported.name)
        _write_once(path, lambda target: quantize_dynamic(
            exported, target, weight_type=QuantType.QInt8, per_channel=True))
    return path


def _export(model: SentenceTransformer, target: Path) -> None:
    import torch

    transformer = model[0].auto_model.eval()  # type: ignore[union-attr]

    class _Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.transformer(input_ids=input_ids, attention_mask=attention_mask,
                                    token_type_ids=token_type_ids).last_hidden_state

    sample = model.tokenizer(["an example sentence"], return_tensors="pt")
    args = tuple(sample.get(name, torch.zeros_like(sample["input_ids"])) for name in INPUTS)
    # The exporter warns about tracing details that do not apply to a fixed BERT-style graph.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Graph().eval(), args, str(target), input_names=list(INPUTS), output_names=["hidden"],
            dynamic_axes={name: {0: "batch", 1: "tokens"} for name in (*INPUTS, "hidden")},
            opset_version=_OPSET, dynamo=False,
        )


def _write_once(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` a temporary file beside ``path``, then rename it to ``path`` (atomic on one filesystem)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp.onnx")
    os.close(handle)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
