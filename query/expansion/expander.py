"""LLM query expansion: extra keyword variants, paraphrased questions and a hypothetical answer passage.

The query side asks an OpenAI-compatible chat-completions API to rewrite a search query before the legs
run: ``lexical`` variants widen the BM25 leg (synonyms, identifier spellings), ``questions`` and ``passage``
(HyDE: embed what an answer would look like) widen the vector leg.

Expansion is an optional extra, never a dependency: it is skipped when the keyword leg already has a clear
winner, served from a cache when it can be, time-boxed to ``expansion.timeout_s`` retries included, and
every failure (timeout, 429, 5xx, unparseable output, Redis down) ends as an :class:`ExpansionOutcome`
without an expansion, never as an exception that fails the search.

Layout: the prompt, the parser and the result type are in :mod:`shardfuse.query.expansion.prompt`, the cache key,
port and Redis adapter in :mod:`shardfuse.query.expansion.cache`; here are the skip rule, the retry rule and
:class:`QueryExpander`, which does the I/O.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from shardfuse.pipeline.config.settings import ExpansionSettings
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
    # The SDK takes over a second to import: it is imported when the first client is built, not here.
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

log = logging.getLogger(__name__)

# One retry at most, and only when it fits in what is left of the time budget.
_MAX_ATTEMPTS = 2
# Statuses worth a second attempt (the ones the OpenAI SDK itself retries); every other 4xx is final.
_RETRYABLE_STATUSES = frozenset({408, 409, 429})
# Pause before a retry when the server does not say how long to wait.
_DEFAULT_RETRY_DELAY_S = 0.2
# Do not start an attempt with less time than this left: it could not complete anyway.
_MIN_ATTEMPT_S = 0.05

__all__ = [
    "MAX_PASSAGE_CHARS", "MAX_VARIANT_CHARS", "PROMPT_VERSION", "Expansion", "ExpansionCache", "ExpansionOutcome",
    "QueryExpander", "RedisExpansionCache", "build_messages", "cache_key", "keyword_leg_is_decisive",
    "parse_expansion", "retry_delay",
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



# -- retry rule ------------------------------------------------------------------------------------------
def retry_delay(status: int, headers: Mapping[str, str]) -> float | None:
    """Seconds to wait before retrying a request that got ``status``, or ``None`` when a retry cannot help.

    Follows the server: ``x-should-retry``, then ``retry-after-ms`` / ``retry-after`` (seconds), else a
    short default pause. ``headers`` must be case-insensitive (as ``httpx.Headers`` are).
    """
    should_retry = headers.get("x-should-retry")
    if should_retry == "false" or (should_retry != "true" and status not in _RETRYABLE_STATUSES and status < 500):
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            delay = float(value) / divisor
        except ValueError:
            continue  # an HTTP date, or garbage: the default pause will do
        if math.isfinite(delay) and delay >= 0:
            return delay
    return _DEFAULT_RETRY_DELAY_S


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
        self._client = client
        self._owns_client = client is None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._owns_client and self._client is not None:
                self._client.close()
                self._client = None

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
        """One attempt, and one retry if the server asks for one and the budget still allows it.

        Retries are ours, not the SDK's (``max_retries=0``): the SDK honours a ``Retry-After`` of up to two
        minutes, and each attempt's timeout must be what is left of the budget, not the whole of it.
        """
        import openai
        from openai.types.chat import ChatCompletion

        client = self._get_client()
        delay: float | None
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            remaining = deadline - time.perf_counter()
            if remaining < _MIN_ATTEMPT_S:
                raise _Failed(f"time budget of {self._settings.timeout_s:g} s spent before attempt {attempt}")
            try:
                response = client.with_options(timeout=remaining, max_retries=0).chat.completions.create(
                    model=self._settings.model,
                    messages=messages,
                    temperature=0,
                    response_format={"type": "json_object"},
                )
            except openai.APITimeoutError:
                raise _Failed(f"timed out (budget {self._settings.timeout_s:g} s)") from None
            except openai.APIConnectionError as exc:
                failure, delay = f"connection error: {exc.__cause__ or exc}", _DEFAULT_RETRY_DELAY_S
            except openai.APIStatusError as exc:
                failure, delay = f"HTTP {exc.status_code}", retry_delay(exc.status_code, exc.response.headers)
            except openai.OpenAIError as exc:
                raise _Failed(f"{type(exc).__name__}: {exc}") from None
            else:
                # The SDK hands back the raw text when a proxy answers 200 with something other than JSON.
                if not isinstance(response, ChatCompletion):
                    raise _Failed(f"the server's reply is not a chat completion ({type(response).__name__})")
                return response
            if delay is None or attempt == _MAX_ATTEMPTS:
                raise _Failed(failure)
            if time.perf_counter() + delay + _MIN_ATTEMPT_S > deadline:
                raise _Failed(f"{failure}; no time left to retry after {delay:g} s")
            log.info("query expansion: %s, retrying in %.2f s", failure, delay)
            time.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

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

    def _get_client(self) -> openai.OpenAI:
        with self._lock:
            if self._client is None:
                import openai

                settings = self._settings
                self._client = openai.OpenAI(
                    base_url=settings.base_url,
                    # The SDK refuses to start without a key; local OpenAI-compatible servers ignore it.
                    api_key=settings.api_key.get_secret_value() or "unset",
                    timeout=settings.timeout_s,
                    max_retries=0,
                )
            return self._client


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
