"""Contexts for the chunks of a document from an OpenAI-compatible chat model, one request per chunk.

For each :meth:`LlmContextualizer.contexts` call:

1. The cache answers what it knows, keyed by ``(doc_hash, chunk_hash)``, the model and
   :data:`~shardfuse.pipeline.ingest.context.prompt.PROMPT_VERSION`; equal chunk hashes are asked for once.
2. Every miss takes its estimated tokens (prompt plus the longest answer) from the :class:`RunBudget`,
   then asks the model on up to ``max_concurrent`` threads, each request under the backpressure slot and
   retried on 429 (honouring ``Retry-After``), 5xx, timeouts and connection errors within ``max_retry_s``.
3. A chunk that gets no context (a permanent 4xx, retries spent, an empty answer, the budget exhausted)
   ends as a :class:`ContextOutcome` with ``context=None`` and a short reason, never as an exception: the
   caller indexes it without a context and marks it for a backfill. New contexts go into the cache.
4. Under the caller's current deadline (:mod:`shardfuse.pipeline.core.deadline`: the ingest stage's
   per-document deadline), no request waits longer than the deadline leaves, no retry is planned past it,
   and a request the deadline cut short, or one that would start after it, fails the whole call with
   :class:`~shardfuse.pipeline.core.errors.DeadlineExceededError` (the document is dead-lettered, its
   siblings complete); the contexts already answered are cached first, so a retry pays only for the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import SecretStr

from shardfuse.pipeline.core import deadline as deadlines
from shardfuse.pipeline.core.deadline import Deadline
from shardfuse.pipeline.core.errors import (
    DeadlineExceededError,
    PermanentError,
    ShardfuseError,
    StoreUnavailableError,
    TransientError,
)
from shardfuse.pipeline.core.http_api import Endpoint, OpenAIApi, call_with_retries, is_rate_limited
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.limiters.backpressure import Outcome
from shardfuse.pipeline.ingest.context.prompt import (
    PROMPT_VERSION,
    DocumentSection,
    build_messages,
    clean_context,
    document_section,
    estimate_prompt_tokens,
)
from shardfuse.pipeline.ingest.context.run_budget import RunBudget as RunBudget  # re-exported

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

log = logging.getLogger(__name__)

# The answer's length limit: the prompt asks for 50 to 100 tokens; this leaves room without paying for an essay.
MAX_ANSWER_TOKENS = 150
BUDGET_EXHAUSTED = "run token budget exhausted"
_ASKING = "asking the chat model for its chunks' contexts"


@dataclass(frozen=True, slots=True)
class ContextRequest:
    chunk_hash: str
    chunk_text: str


@dataclass(frozen=True, slots=True)
class ContextOutcome:
    """The context of one chunk, or ``context=None`` and why not (the caller falls back and backfills)."""

    chunk_hash: str
    context: str | None
    error: str | None


class ContextCache(Protocol):
    """Contexts by ``(doc_hash, chunk_hash)``, model and prompt version. An adapter whose store is down
    raises :class:`~shardfuse.pipeline.core.errors.StoreUnavailableError` (or logs and answers nothing): that costs the
    cache, not the contexts."""

    def get_many(
        self, keys: Sequence[tuple[str, str]], *, model: str, prompt_version: str
    ) -> dict[tuple[str, str], str]: ...

    def put_many(self, items: Mapping[tuple[str, str], str], *, model: str, prompt_version: str) -> None: ...


class BackpressurePort(Protocol):
    """What is used of :class:`~shardfuse.pipeline.embed.limiters.backpressure.Backpressure`."""

    def request(self, tokens: int, *, timeout_s: float) -> AbstractContextManager[Any]: ...

    def record(self, outcome: Outcome) -> None: ...


class LlmContextualizer:
    """Asks an OpenAI-compatible chat model for contextual-retrieval contexts (see the module docstring).

    Create one per worker process and :meth:`close` it at shutdown: it holds a thread pool and, from the
    first request on, an SDK client (:class:`~shardfuse.pipeline.core.http_api.OpenAIApi`: one request per
    attempt, retries are ours, so backpressure sees every 429).
    """

    def __init__(
        self,
        *,
        model: str,
        api_key: SecretStr,
        base_url: str = "",
        timeout_s: float = 30.0,
        doc_token_budget: int = 6000,
        counter: TokenCounter,
        cache: ContextCache | None = None,
        backpressure: BackpressurePort | None = None,
        max_retry_s: float = 30.0,
        budget: RunBudget | None = None,
        max_concurrent: int = 4,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_concurrent < 1 or doc_token_budget < 1:
            raise ValueError(
                f"max_concurrent ({max_concurrent}) and doc_token_budget ({doc_token_budget}) must be >= 1"
            )
        self._model = model
        self._api = OpenAIApi(Endpoint("chat completions", model, "context", base_url), api_key=api_key,
                              timeout_s=timeout_s)  # fmt: skip
        self._timeout_s = timeout_s
        self._doc_token_budget = doc_token_budget
        self._counter = counter
        self._cache = cache
        self._backpressure = backpressure
        self._max_retry_s = max_retry_s
        self._budget = budget
        self._sleep = sleep
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="context-request")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._api.close()

    def contexts(self, document: str, requests: Sequence[ContextRequest], *, doc_hash: str) -> list[ContextOutcome]:
        """One outcome per request, in order, for the chunks of ``document`` (identified by ``doc_hash``);
        :class:`DeadlineExceededError` when the caller's current deadline cut the requests short."""
        texts: dict[str, str] = {}
        for request in requests:
            texts.setdefault(request.chunk_hash, request.chunk_text)  # equal hashes: equal text, asked once
        known = self._cached(doc_hash, list(texts))
        missing = [(chunk_hash, text) for chunk_hash, text in texts.items() if chunk_hash not in known]
        fresh: dict[str, ContextOutcome] = {}
        if missing:
            section = document_section(document, counter=self._counter, token_budget=self._doc_token_budget)
            deadline = deadlines.current()  # the request threads do not share this thread's context
            futures = [self._pool.submit(self._context_for, section, h, text, deadline) for h, text in missing]
            fresh, overrun = self._gathered([h for h, _ in missing], futures)
            new = {(doc_hash, h): o.context for h, o in fresh.items() if o.context is not None}
            self._store(new)
            if overrun is not None:
                raise overrun
            failures = [o for o in fresh.values() if o.context is None]
            if failures:
                log.warning("no context for %d of %d chunk(s) of document %s (first: %s)",
                            len(failures), len(missing), doc_hash, failures[0].error)  # fmt: skip
        return [
            ContextOutcome(r.chunk_hash, known[r.chunk_hash], None) if r.chunk_hash in known else fresh[r.chunk_hash]
            for r in requests
        ]

    @staticmethod
    def _gathered(hashes: list[str], futures: list[Future[ContextOutcome]]
                  ) -> tuple[dict[str, ContextOutcome], DeadlineExceededError | None]:
        """The outcomes that came back, and the deadline's error if it cut any request short (the requests
        not yet started are then cancelled)."""
        fresh: dict[str, ContextOutcome] = {}
        overrun: DeadlineExceededError | None = None
        for chunk_hash, future in zip(hashes, futures, strict=True):
            if overrun is not None:  # keep what already came back; cancel what has not started
                if not future.cancel() and future.done() and future.exception() is None:
                    fresh[chunk_hash] = future.result()
                continue
            try:
                fresh[chunk_hash] = future.result()
            except DeadlineExceededError as exc:
                overrun = exc
        return fresh, overrun

    # -- cache ---------------------------------------------------------------------------------------------
    def _cached(self, doc_hash: str, chunk_hashes: list[str]) -> dict[str, str]:
        if self._cache is None or not chunk_hashes:
            return {}
        keys = [(doc_hash, h) for h in chunk_hashes]
        try:
            found = self._cache.get_many(keys, model=self._model, prompt_version=PROMPT_VERSION)
        except StoreUnavailableError as exc:
            log.warning("context cache unavailable, reading: %s", exc)
            return {}
        return {h: context.strip() for (_, h), context in found.items() if context and context.strip()}

    def _store(self, items: Mapping[tuple[str, str], str]) -> None:
        if self._cache is None or not items:
            return
        try:
            self._cache.put_many(items, model=self._model, prompt_version=PROMPT_VERSION)
        except StoreUnavailableError as exc:
            log.warning("context cache unavailable, writing: %s", exc)

    # -- one chunk: budget, retries, backpressure; prepare -> call -> parse -------------------------------
    def _context_for(self, section: DocumentSection, chunk_hash: str, chunk_text: str,
                     deadline: Deadline | None = None) -> ContextOutcome:
        """The outcome for one chunk; every failure ends here as an outcome, except the deadline's."""
        if deadline is not None:
            deadline.check(_ASKING)
        tokens = estimate_prompt_tokens(section, chunk_text, counter=self._counter)
        if self._budget is not None and not self._budget.take(tokens + MAX_ANSWER_TOKENS):
            return ContextOutcome(chunk_hash, None, BUDGET_EXHAUSTED)
        messages = build_messages(section, chunk_text)
        attempts = 0

        def attempt() -> str:
            nonlocal attempts
            attempts += 1
            return self._attempt(messages, tokens, deadline)

        try:
            context = call_with_retries(
                attempt,
                max_retry_s=self._max_retry_s if deadline is None else min(self._max_retry_s, deadline.remaining_s),
                on_rate_limited=self._on_rate_limited,
                sleep=self._sleep,
                clock=self._clock,
                provider="chat",
            )
        except DeadlineExceededError:
            raise
        except Exception as exc:  # noqa: BLE001 - one chunk's failure is its outcome, not the document's
            reason = str(exc) if isinstance(exc, ShardfuseError) else f"{type(exc).__name__}: {exc}"
            suffix = f" ({attempts} attempts)" if attempts > 1 else ""
            log.debug("no context for chunk %s: %s%s", chunk_hash, reason, suffix)
            return ContextOutcome(chunk_hash, None, reason + suffix)
        return ContextOutcome(chunk_hash, context, None)

    def _attempt(self, messages: list[ChatCompletionMessageParam], tokens: int, deadline: Deadline | None) -> str:
        backpressure = self._backpressure
        timeout_s = self._timeout_s if deadline is None else deadline.timeout_s(self._timeout_s, _ASKING)
        lease = backpressure.request(tokens, timeout_s=timeout_s) if backpressure is not None else nullcontext()
        with lease:  # the slot is held only around the call, never during a retry's wait
            try:
                response = self._call(messages, timeout_s=None if deadline is None else deadline.timeout_s(
                    self._timeout_s, _ASKING))
            except TransientError as exc:
                if deadline is not None and deadline.expired:  # the deadline cut it short: no retry
                    raise deadline.error(_ASKING) from exc
                # A 429 reaches the backpressure through on_rate_limited; a 4xx says nothing about load.
                if backpressure is not None and not is_rate_limited(exc):
                    backpressure.record(Outcome.failed())
                raise
            if backpressure is not None:
                backpressure.record(Outcome.success())
        return self._parse(response)

    def _call(self, messages: list[ChatCompletionMessageParam], *, timeout_s: float | None = None) -> ChatCompletion:
        return self._api.chat_completion(
            model=self._model, messages=messages, max_tokens=MAX_ANSWER_TOKENS, temperature=0, timeout_s=timeout_s
        )

    def _parse(self, response: ChatCompletion) -> str:
        if not response.choices:
            raise PermanentError("the model returned no choices")
        choice = response.choices[0]
        context = clean_context(choice.message.content, counter=self._counter)
        if not context:
            # Temperature 0: asking again would most likely get the same nothing.
            raise PermanentError(f"empty answer (finish_reason={choice.finish_reason})")
        return context

    def _on_rate_limited(self, retry_after_s: float | None) -> None:
        if self._backpressure is not None:
            self._backpressure.record(Outcome.rate_limited(retry_after_s))
