"""LLM query expansion: extra keyword variants, paraphrased questions and a hypothetical answer passage.

The query side asks an OpenAI-compatible chat-completions API to rewrite a search query before the legs
run: ``lexical`` variants widen the BM25 leg (synonyms, identifier spellings), ``questions`` and ``passage``
(HyDE: embed what an answer would look like) widen the vector leg.

Expansion is an optional extra, never a dependency: it is skipped when the keyword leg already has a clear
winner, served from a cache when it can be, time-boxed to ``expansion.timeout_s`` retries included, and
every failure (timeout, 429, 5xx, unparseable output, Redis down) ends as an :class:`ExpansionOutcome`
without an expansion, never as an exception that fails the search.

Layout: the prompt, the parser and the result type are in :mod:`shardfuse.query.expansion.prompt`, the cache
key, port and Redis adapter in :mod:`shardfuse.query.expansion.cache`; the client, its retry policy and its
errors are the ones every hosted API shares (:mod:`shardfuse.pipeline.core.http_api`). Here are the skip rule
and :class:`QueryExpander`, which does the I/O.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from shardfuse.pipeline.config.settings import ExpansionSettings
from shardfuse.pipeline.core.errors import ShardfuseError
from shardfuse.pipeline.core.http_api import Endpoint, OpenAIApi, call_with_retries
from shardfuse.query.expansion.cache import ExpansionCache, RedisExpansionCache, cache_key
from shardfuse.query.expansion.prompt import (
    MAX_PASSAGE_CHARS,
    MAX_VARIANT_CHARS,
    PROMPT_VERSION,
    Expansion,
    build_messages,
    normalised,
    parse_expansion,
)

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

log = logging.getLogger(__name__)

# One retry at most, and only when it fits in what is left of the time budget.
_MAX_ATTEMPTS = 2
# The retry's jitter window when the server names no wait: the whole budget is a couple of seconds.
_INITIAL_WAIT_S = 0.2
# Do not start an attempt with less time than this left: it could not complete anyway.
_MIN_ATTEMPT_S = 0.05
# The label under which the retry policy counts 429s and retries, as for contexts.
_PROVIDER = "chat"

__all__ = [
    "MAX_PASSAGE_CHARS", "MAX_VARIANT_CHARS", "PROMPT_VERSION", "Expansion", "ExpansionCache", "ExpansionOutcome",
    "QueryExpander", "RedisExpansionCache", "build_messages", "cache_key", "keyword_leg_is_decisive",
    "parse_expansion",
]  # fmt: skip

Source = Literal["cache", "model", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class ExpansionOutcome:
    """The result of :meth:`QueryExpander.expand`: the expansion (if any), where it came from, how long it
    took, and why there is none (``reason`` is set for ``skipped`` and ``failed``)."""

    expansion: Expansion | None
    source: Source
    ms: float
    reason: str | None = None


# -- when to skip ----------------------------------------------------------------------------------------
def keyword_leg_is_decisive(scores: Sequence[float], *, min_top: float, min_gap_ratio: float) -> bool:
    """True when the keyword leg already has a clear winner, so expansion would only add latency.

    That is: the best score is at least ``min_top`` and leads the second best by at least ``min_gap_ratio``
    of itself (``(top - second) / top``). A single hit counts as separated; no hits, or a best score that
    is not positive, never decide.
    """
    best = heapq.nlargest(2, scores)
    if not best or best[0] <= 0 or best[0] < min_top:
        return False
    if len(best) == 1:
        return True
    top, second = best
    return (top - second) / top >= min_gap_ratio


# -- the expander ----------------------------------------------------------------------------------------
class _Failed(Exception):
    """Why the model gave no expansion; ends as ``ExpansionOutcome(source="failed", reason=...)``."""


class QueryExpander:
    """Expands queries through an OpenAI-compatible chat model, within ``settings.timeout_s``.

    Create one per query worker process and :meth:`close` it at shutdown. The SDK client is built on first
    use unless one is given; the given one is never closed here. Safe to share between threads.
    """

    def __init__(
        self,
        *,
        settings: ExpansionSettings,
        cache: ExpansionCache | None = None,
        client: openai.OpenAI | None = None,
    ) -> None:
        self._settings = settings
        self._cache = cache if settings.cache_ttl_s > 0 else None
        endpoint = Endpoint("chat completions", settings.model, "query.expansion", settings.base_url)
        self._api = OpenAIApi(endpoint, api_key=settings.api_key, timeout_s=settings.timeout_s, client=client)

    def close(self) -> None:
        self._api.close()

    def expand(self, query: str, *, keyword_scores: Sequence[float] | None = None) -> ExpansionOutcome:
        """Expand ``query``; pass the keyword leg's scores to skip expansion when that leg is decisive."""
        started = time.perf_counter()
        settings = self._settings
        query = normalised(query)
        reason = self._skip_reason(query, keyword_scores)
        if reason is not None:
            return ExpansionOutcome(None, "skipped", _ms(started), reason)
        key = cache_key(query, model=settings.model, max_variants=settings.max_variants)
        cached = self._cache.get(key) if self._cache is not None else None
        if cached is not None:
            return ExpansionOutcome(cached, "cache", _ms(started))
        try:
            expansion = self._ask_model(query, deadline=started + settings.timeout_s)
        except _Failed as exc:
            log.warning("query expansion failed after %.0f ms, searching without it: %s", _ms(started), exc)
            return ExpansionOutcome(None, "failed", _ms(started), str(exc))
        if self._cache is not None:
            self._cache.put(key, expansion, settings.cache_ttl_s)
        return ExpansionOutcome(expansion, "model", _ms(started))

    def _skip_reason(self, query: str, keyword_scores: Sequence[float] | None) -> str | None:
        settings = self._settings
        if not settings.enabled:
            return "expansion is disabled"
        if not query:
            return "empty query"
        if keyword_scores is not None and keyword_leg_is_decisive(
            keyword_scores, min_top=settings.skip_min_top_score, min_gap_ratio=settings.skip_min_gap_ratio
        ):
            return "the keyword leg is decisive"
        return None

    # prepare -> call -> parse
    def _ask_model(self, query: str, *, deadline: float) -> Expansion:
        messages = build_messages(query, max_variants=self._settings.max_variants)
        response = self._call(messages, deadline=deadline)
        return self._parse(response, query=query)

    def _call(self, messages: list[ChatCompletionMessageParam], *, deadline: float) -> ChatCompletion:
        """One attempt, and one retry of a transient failure if its wait (at least a ``Retry-After``) and a
        minimal attempt still fit before ``deadline``. Each attempt's timeout is what is left of the budget."""
        budget_s = deadline - time.perf_counter() - _MIN_ATTEMPT_S
        if budget_s < 0:
            raise _Failed(f"time budget of {self._settings.timeout_s:g} s spent before asking the model")

        def attempt() -> ChatCompletion:
            return self._api.chat_completion(
                timeout_s=max(deadline - time.perf_counter(), _MIN_ATTEMPT_S),
                model=self._settings.model,
                messages=messages,
                temperature=0,
                response_format={"type": "json_object"},
            )

        try:
            return call_with_retries(attempt, max_retry_s=budget_s, max_attempts=_MAX_ATTEMPTS,
                                     initial_wait_s=_INITIAL_WAIT_S, provider=_PROVIDER)  # fmt: skip
        except ShardfuseError as exc:
            raise _Failed(str(exc)) from None

    def _parse(self, response: ChatCompletion, *, query: str) -> Expansion:
        if not response.choices:
            raise _Failed("the model returned no choices")
        content = response.choices[0].message.content
        if not content:
            raise _Failed(f"the model returned no content (finish_reason={response.choices[0].finish_reason})")
        try:
            return parse_expansion(content, query=query, max_variants=self._settings.max_variants)
        except ValueError as exc:
            raise _Failed(f"unusable model output: {exc}") from None


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
