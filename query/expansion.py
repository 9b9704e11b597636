"""LLM query expansion: extra keyword variants, paraphrased questions and a hypothetical answer passage.

The query side asks an OpenAI-compatible chat-completions API to rewrite a search query before the legs
run: ``lexical`` variants widen the BM25 leg (synonyms, identifier spellings), ``questions`` and ``passage``
(HyDE: embed what an answer would look like) widen the vector leg.

Expansion is an optional extra, never a dependency: it is skipped when the keyword leg already has a clear
winner, served from a cache when it can be, time-boxed to ``expansion.timeout_s`` retries included, and
every failure (timeout, 429, 5xx, unparseable output, Redis down) ends as an :class:`ExpansionOutcome`
without an expansion, never as an exception that fails the search.

Layout: pure logic first (the result type, the skip rule, the prompt, the parser, the cache key, the retry
rule), then the cache port and its Redis adapter, then :class:`QueryExpander`, which does the I/O.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from redis.exceptions import RedisError

from pipeline.settings import ExpansionSettings

if TYPE_CHECKING:
    # The SDK takes over a second to import: it is imported when the first client is built, not here.
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

log = logging.getLogger(__name__)

# Bump whenever the prompt or the parser changes what an expansion contains: cached expansions are keyed by it.
PROMPT_VERSION = 1
MAX_VARIANT_CHARS = 300
MAX_PASSAGE_CHARS = 1200
# One retry at most, and only when it fits in what is left of the time budget.
_MAX_ATTEMPTS = 2
# Statuses worth a second attempt (the ones the OpenAI SDK itself retries); every other 4xx is final.
_RETRYABLE_STATUSES = frozenset({408, 409, 429})
# Pause before a retry when the server does not say how long to wait.
_DEFAULT_RETRY_DELAY_S = 0.2
# Do not start an attempt with less time than this left: it could not complete anyway.
_MIN_ATTEMPT_S = 0.05

Source = Literal["cache", "model", "skipped", "failed"]


# -- results ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Expansion:
    """What the model suggested for one query; every entry differs from the query and from each other."""

    lexical: tuple[str, ...] = ()  # keyword variants for the BM25 leg
    questions: tuple[str, ...] = ()  # paraphrased questions for the vector leg
    passage: str | None = None  # a short hypothetical answer (HyDE) for the vector leg

    @property
    def is_empty(self) -> bool:
        return not (self.lexical or self.questions or self.passage)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` reads it back."""
        return {"lexical": list(self.lexical), "questions": list(self.questions), "passage": self.passage}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Expansion:
        """The expansion :meth:`to_dict` wrote. Raises ``ValueError`` on any other shape (a corrupt entry)."""
        lexical, questions, passage = data.get("lexical", []), data.get("questions", []), data.get("passage")
        for name, values in (("lexical", lexical), ("questions", questions)):
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"expansion {name!r} must be a list of strings")
        if passage is not None and not isinstance(passage, str):
            raise ValueError("expansion 'passage' must be a string or null")
        return cls(lexical=tuple(lexical), questions=tuple(questions), passage=passage)


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


# -- prompt and parsing ----------------------------------------------------------------------------------
_SYSTEM_PROMPT = """\
You expand search queries for a hybrid search engine over source code and technical documents. \
The engine runs a keyword (BM25) search and a semantic (embedding) search.

Reply with exactly one JSON object and nothing else:
{{"lexical": [...], "questions": [...], "passage": "..."}}

- "lexical": up to {n} keyword variants for the keyword search: synonyms, related technical terms, \
identifier spellings (snake_case, camelCase, PascalCase), short reformulations. Keywords, not sentences.
- "questions": up to {n} paraphrases of the query as natural-language questions.
- "passage": a short passage (two to four sentences) that would answer the query, written the way \
documentation or a code comment would say it.

Never repeat the query itself. Use an empty list when you have nothing useful to add."""


def build_messages(query: str, *, max_variants: int) -> list[ChatCompletionMessageParam]:
    """The chat messages asking for an expansion of ``query`` with at most ``max_variants`` per list."""
    return [
        {"role": "system", "content": _SYSTEM_PROMPT.format(n=max_variants)},
        {"role": "user", "content": query},
    ]


_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def _json_object(text: str) -> dict[str, Any]:
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        # Some models wrap the object in a sentence; take the outermost braces before giving up.
        start, end = body.find("{"), body.rfind("}")
        if start < 0 or end <= start:
            raise ValueError("no JSON object in the model's reply") from None
        try:
            data = json.loads(body[start : end + 1])
        except json.JSONDecodeError as exc:
            raise ValueError(f"the model's reply is not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the model's reply is a JSON {type(data).__name__}, not an object")
    return data


def _normalised(text: str) -> str:
    return " ".join(text.split())


def _variants(values: object, *, seen: set[str], limit: int) -> tuple[str, ...]:
    """Strings only, whitespace collapsed, capped in length; blank entries, surplus ones and those already
    in ``seen`` (case-insensitively; it starts with the query and grows as entries are kept) dropped."""
    if not isinstance(values, list):
        return ()
    kept: list[str] = []
    for value in values:
        if len(kept) >= limit:
            break
        if not isinstance(value, str):
            continue
        text = _normalised(value)[:MAX_VARIANT_CHARS].rstrip()
        if text and text.casefold() not in seen:
            seen.add(text.casefold())
            kept.append(text)
    return tuple(kept)


def parse_expansion(text: str, *, query: str, max_variants: int) -> Expansion:
    """The :class:`Expansion` in a model reply ``text`` (a JSON object, possibly inside a code fence).

    Tolerant of what models do: wrong types, blanks, duplicates and echoes of ``query`` are dropped, each
    list is cut to ``max_variants``, and lengths are capped. Raises ``ValueError`` when the reply holds no
    JSON object or an object with none of the expected keys.
    """
    data = _json_object(text)
    if not data.keys() & {"lexical", "questions", "passage"}:
        raise ValueError(f"the model's reply has none of lexical, questions, passage (keys: {sorted(data)[:5]})")
    query_key = _normalised(query).casefold()
    lexical = _variants(data.get("lexical"), seen={query_key}, limit=max_variants)
    # Questions are deduplicated separately: the same words may serve both legs.
    questions = _variants(data.get("questions"), seen={query_key}, limit=max_variants)
    passage = data.get("passage")
    if isinstance(passage, str):
        passage = _normalised(passage)[:MAX_PASSAGE_CHARS].rstrip() or None
        if passage is not None and passage.casefold() == query_key:
            passage = None
    else:
        passage = None
    return Expansion(lexical=lexical, questions=questions, passage=passage)


# -- cache key -------------------------------------------------------------------------------------------
def cache_key(query: str, *, model: str, max_variants: int) -> str:
    """A backend-neutral key for the expansion of ``query``: the SHA-256 of everything that shapes it.

    :data:`PROMPT_VERSION` is part of it, so a prompt change never serves expansions of the old prompt.
    Cache adapters add their own namespace (``RedisExpansionCache``'s ``prefix``).
    """
    payload = {"v": PROMPT_VERSION, "model": model, "max_variants": max_variants, "query": _normalised(query)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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


# -- cache port and adapter ------------------------------------------------------------------------------
class ExpansionCache(Protocol):
    def get(self, key: str) -> Expansion | None: ...

    def put(self, key: str, expansion: Expansion, ttl_s: int) -> None: ...


class _Redis(Protocol):
    def get(self, name: str) -> Any: ...

    def set(self, name: str, value: str, *, ex: int) -> Any: ...


class RedisExpansionCache:
    """Expansions as JSON in Redis under ``prefix`` + key, with a TTL. Redis being down, or an entry being
    corrupt, costs the cache and nothing else: errors are logged and swallowed."""

    def __init__(self, client: _Redis, *, prefix: str = "shardfuse:expansion:") -> None:
        self._redis = client
        self._prefix = prefix

    def get(self, key: str) -> Expansion | None:
        try:
            raw = self._redis.get(self._prefix + key)
        except RedisError as exc:
            log.warning("expansion cache unavailable, reading: %s", exc)
            return None
        if raw is None:
            return None
        try:
            return Expansion.from_dict(json.loads(raw))
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring a corrupt expansion cache entry %s: %s", key, exc)
            return None

    def put(self, key: str, expansion: Expansion, ttl_s: int) -> None:
        try:
            self._redis.set(self._prefix + key, json.dumps(expansion.to_dict()), ex=ttl_s)
        except RedisError as exc:
            log.warning("expansion cache unavailable, writing: %s", exc)


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
        query = _normalised(query)
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
