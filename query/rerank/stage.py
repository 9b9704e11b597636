"""The rerank step of a search: the best ranked candidates reordered by a reranker, or left as they were.

:class:`RerankStage` runs after fusion, hydration and boosts, before the per-file cap: it sends the first
``rerank.top_n`` candidates (each its context and text, as indexed, cut to ``rerank.max_chars``) to the
reranker, and puts them in the reranker's order, each with the reranker's score; candidates below them keep
their order and score. The whole step keeps to ``rerank.budget_ms``: every attempt's timeout is what is left
of it, and a retry (of a 429, a 5xx, a timeout, a connection refused, an unreadable answer) starts only when
its wait (at least the server's ``Retry-After``) and a minimal attempt still fit. When the reranker fails or
the budget runs out, the candidates keep the fused order, the answer says why
(``"rerank": {"applied": false, "reason": ...}``) and :data:`~shardfuse.pipeline.observability.metrics.RERANKS`
counts the outcome. A reranker never fails a search.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from shardfuse.pipeline.config.rerank import RerankSettings
from shardfuse.pipeline.core.errors import PermanentError, RateLimitedError, ShardfuseError
from shardfuse.pipeline.core.http_api import call_with_retries
from shardfuse.pipeline.index.store import ChunkRecord
from shardfuse.pipeline.observability import metrics
from shardfuse.query.answer import Ranked
from shardfuse.query.rerank.port import MalformedRerankError, Reranker, RerankTimeoutError

log = logging.getLogger(__name__)

# No attempt starts with less than this left of the budget: it could not complete anyway.
MIN_ATTEMPT_S = 0.02
# The first retry's jitter window when the server names no wait: the whole budget is about a second.
_INITIAL_WAIT_S = 0.05
NOT_CONFIGURED = "no reranker is configured (rerank.provider = none)"
SWITCHED_OFF = "switched off"
NO_CANDIDATES = "no candidates"
# Reasons an answer was not reranked that the next identical query would meet again.
_SETTLED = frozenset({NOT_CONFIGURED, SWITCHED_OFF, NO_CANDIDATES})


def document_text(record: ChunkRecord, *, max_chars: int) -> str:
    """What the reranker reads of a candidate: its context, then its text (as both legs indexed it), cut."""
    text = f"{record.context}\n\n{record.text}" if record.context else record.text
    return text[:max_chars]


def reordered(ranked: Sequence[Ranked], scores: Sequence[float]) -> list[Ranked]:
    """The first ``len(scores)`` of ``ranked`` by descending score (ties keep their order), each scored by
    the reranker; the rest after them, unchanged."""
    head = sorted(zip(ranked, scores, strict=False), key=lambda pair: -pair[1])
    return [(pair, score, boost) for ((pair, _, boost), score) in head] + list(ranked[len(scores):])


def outcome_of(exc: ShardfuseError) -> str:
    """The metric's outcome label for a failure (a bounded set)."""
    if isinstance(exc, RateLimitedError):
        return "rate_limited"
    if isinstance(exc, RerankTimeoutError):
        return "timeout"
    if isinstance(exc, MalformedRerankError):
        return "malformed"
    if isinstance(exc, PermanentError):
        return "refused"
    return "unavailable"


class RerankStage:
    """The configured reranker (None: none) and its settings; one per query worker, shared by its threads."""

    def __init__(self, reranker: Reranker | None, settings: RerankSettings) -> None:
        self._reranker = reranker
        self._settings = settings

    @property
    def name(self) -> str | None:
        return None if self._reranker is None else self._reranker.name

    @property
    def fingerprint(self) -> str:
        """What of the settings decides an answer's order, for the result cache's key ("" when none)."""
        if self._reranker is None:
            return ""
        chosen = self._settings.model_dump(mode="json", exclude={"api_key", "budget_ms", "max_attempts"})
        return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]

    def close(self) -> None:
        if self._reranker is not None:
            self._reranker.close()

    def apply(
        self, query: str, ranked: Sequence[Ranked], *, requested: bool | None, timings: dict[str, float]
    ) -> tuple[list[Ranked], dict[str, Any] | None]:
        """``ranked`` reranked when the request (``requested``; None: the settings) asks for it, and what the
        answer says about it (None when no reranker is configured and the request did not ask)."""
        if self._reranker is None:
            return list(ranked), None if not requested else {"applied": False, "reason": NOT_CONFIGURED}
        if not (self._settings.enabled if requested is None else requested):
            return list(ranked), {"applied": False, "reason": SWITCHED_OFF, "model": self._reranker.name}
        if not ranked:
            return [], {"applied": False, "reason": NO_CANDIDATES, "model": self._reranker.name}
        started = time.perf_counter()
        head = ranked[: self._settings.top_n]
        info: dict[str, Any] = {"applied": False, "model": self._reranker.name, "candidates": len(head)}
        try:
            texts = [document_text(pair[1], max_chars=self._settings.max_chars) for (pair, _, _) in head]
            scores = self._scores(self._reranker, query, texts, started=started)
        except ShardfuseError as exc:
            outcome = outcome_of(exc)
            log.warning("rerank (%s) failed after %.0f ms, keeping the fused order: %s", self._reranker.name,
                        _ms(started), exc)
            info["reason"] = f"{outcome}: {exc}"
            result = list(ranked)
        else:
            outcome = "applied"
            info["applied"] = True
            result = reordered(ranked, scores)
        metrics.inc(metrics.RERANKS, provider=self._settings.provider, outcome=outcome)
        timings["rerank"] = info["ms"] = _ms(started)
        return result, info

    def _scores(self, reranker: Reranker, query: str, texts: list[str], *, started: float) -> list[float]:
        budget_s = self._settings.budget_ms / 1000
        deadline = started + budget_s

        def attempt() -> list[float]:
            left = deadline - time.perf_counter()
            if left < MIN_ATTEMPT_S:
                raise RerankTimeoutError(f"the rerank budget of {self._settings.budget_ms} ms is spent")
            return reranker.rerank(query, texts, timeout_s=left)

        # tenacity's budget counts from here: whatever ran before (building the texts) is taken off it.
        spare = max(deadline - time.perf_counter() - MIN_ATTEMPT_S, 0.0)
        return call_with_retries(attempt, max_retry_s=spare, max_attempts=self._settings.max_attempts,
                                 initial_wait_s=_INITIAL_WAIT_S, provider=f"rerank-{self._settings.provider}")


def cacheable(answer: Mapping[str, Any]) -> bool:
    """False for an answer whose rerank fell back (a 429, a timeout): the next query tries the reranker again
    instead of being served the fused order from the result cache."""
    reranked = answer.get("rerank")
    return not isinstance(reranked, Mapping) or bool(reranked.get("applied")) or reranked.get("reason") in _SETTLED


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


# The stage of a service built without a reranker.
NO_RERANK = RerankStage(None, RerankSettings())
