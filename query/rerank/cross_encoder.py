"""A sentence-transformers ``CrossEncoder`` run in the query worker, on the CPU (the optional ``local`` extra).

The model is loaded once, when the query worker starts: a folder ``CrossEncoder.save`` wrote, or a model name
already in the local Hugging Face cache. A model that cannot be loaded, or that is not a one-score reranker
(``num_labels`` other than 1), is a :class:`ConfigurationError` then, never a failure of each query.

A forward pass cannot be interrupted, so the budget is kept between batches of ``batch_size`` pairs: a batch
starts only while what is left of the budget covers its estimated time (this process's measured seconds per
pair), else the call gives up with :class:`RerankTimeoutError`. Calls take turns on one lock: the model's fast
tokenizer must not be used by two threads at once, and two forward passes would only share the same cores.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.query.rerank.port import MalformedRerankError, RerankTimeoutError

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder

# How much each new measurement moves the estimate of seconds per pair.
_SMOOTHING = 0.3


class CrossEncoderReranker:
    """Scores (query, text) pairs with a cross-encoder loaded in the constructor (seconds, hundreds of MB)."""

    def __init__(self, model: str, *, batch_size: int = 8, max_length: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise ConfigurationError("rerank.provider = local needs sentence-transformers: pip install "
                                     "'shardfuse[local]' (or set rerank.provider to a hosted API)") from exc
        source = _source(model)
        try:
            self._model: CrossEncoder = CrossEncoder(source, device="cpu", max_length=max_length,
                                                     local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigurationError(
                f"cannot load the cross-encoder rerank.model = {model!r}: {exc}. Give a folder CrossEncoder.save "
                "wrote, or the name of a model already in the local Hugging Face cache (HF_HOME)") from exc
        if self._model.num_labels != 1:
            raise ConfigurationError(f"rerank.model = {model!r} gives {self._model.num_labels} scores per pair; a "
                                     "reranker gives one (a cross-encoder trained for relevance, num_labels = 1)")
        self._name = f"local:{Path(source).name if Path(source).is_dir() else model}"
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._clock = clock
        self._seconds_per_pair: float | None = None  # measured; None until the first batch

    @property
    def name(self) -> str:
        return self._name

    def rerank(self, query: str, texts: Sequence[str], *, timeout_s: float) -> list[float]:
        deadline = self._clock() + timeout_s
        if not self._lock.acquire(timeout=max(timeout_s, 0.0)):
            raise RerankTimeoutError(f"the cross-encoder was busy for the whole budget ({timeout_s:.3g}s)")
        try:
            scores: list[float] = []
            for start in range(0, len(texts), self._batch_size):
                batch = [(query, text) for text in texts[start : start + self._batch_size]]
                self._check_time(len(batch), deadline, scored=len(scores), of=len(texts))
                scores.extend(self._predict(batch))
            return scores
        finally:
            self._lock.release()

    def close(self) -> None:
        return  # the model is freed with the process

    def _check_time(self, pairs: int, deadline: float, *, scored: int, of: int) -> None:
        left = deadline - self._clock()
        needed = 0.0 if self._seconds_per_pair is None else self._seconds_per_pair * pairs
        if left <= 0 or needed > left:
            raise RerankTimeoutError(f"the cross-encoder ran out of budget after scoring {scored} of {of} texts "
                                     f"(the next {pairs} need about {needed:.3g}s, {max(left, 0):.3g}s left)")

    def _predict(self, batch: list[tuple[str, str]]) -> list[float]:
        started = self._clock()
        raw = self._model.predict(batch, batch_size=len(batch), show_progress_bar=False, convert_to_numpy=True)
        per_pair = (self._clock() - started) / len(batch)
        previous = self._seconds_per_pair
        self._seconds_per_pair = per_pair if previous is None else previous + _SMOOTHING * (per_pair - previous)
        scores = [float(x) for x in raw.reshape(-1)]
        if len(scores) != len(batch):
            raise MalformedRerankError(f"the cross-encoder gave {len(scores)} scores for {len(batch)} pairs")
        return scores


def _source(model: str) -> str:
    """A folder when ``model`` names one that exists (``~`` expanded); a path-like name that does not exist is
    a configuration error now rather than a hub lookup; anything else is a model name in the local cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if model.startswith((".", "/", "~")) or len(path.parts) > 2:
        raise ConfigurationError(f"rerank.model = {model!r}: no such folder")
    return model
