"""Contextual retrieval contexts, through the real ``openai`` client against a local chat server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from pydantic import SecretStr

from shardfuse.pipeline.core.deadline import Deadline, running_within
from shardfuse.pipeline.core.errors import DeadlineExceededError, StoreUnavailableError
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.limiters.backpressure import Outcome, OutcomeKind
from shardfuse.pipeline.ingest.context.llm import (
    BUDGET_EXHAUSTED,
    MAX_ANSWER_TOKENS,
    ContextOutcome,
    ContextRequest,
    LlmContextualizer,
    RunBudget,
)
from shardfuse.pipeline.ingest.context.prompt import (
    PROMPT_VERSION,
    build_messages,
    clean_context,
    document_section,
    estimate_prompt_tokens,
)
from tests.support.chat_server import FakeChatServer, fake_context, prompt_of
from tests.support.openai_server import CHAT_COMPLETIONS, Received, Reply

MODEL = "ctx-model"
DOC_HASH = "doc-1"
DOCUMENT = (
    "# Shard rebalancing\n\nShards move between nodes when the cluster grows. "
    "The coordinator copies rows, then flips the routing table atomically.\n\n"
    "## Failure handling\n\nA failed copy is retried; the old shard keeps serving until the flip.\n"
)
CHUNKS = [
    "The coordinator copies rows, then flips the routing table atomically.",
    "A failed copy is retried; the old shard keeps serving until the flip.",
    "Shards move between nodes when the cluster grows.",
]


def requests_for(chunks: Sequence[str]) -> list[ContextRequest]:
    return [ContextRequest(chunk_hash=f"h{i}", chunk_text=text) for i, text in enumerate(chunks)]


class DictCache:
    """An in-memory :class:`ContextCache` that remembers how it was called."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, str, str], str] = {}
        self.down = False

    def get_many(
        self, keys: Sequence[tuple[str, str]], *, model: str, prompt_version: str
    ) -> dict[tuple[str, str], str]:
        if self.down:
            raise StoreUnavailableError("cache down")
        return {
            k: self.entries[(*k, model, prompt_version)] for k in keys if (*k, model, prompt_version) in self.entries
        }

    def put_many(self, items: Mapping[tuple[str, str], str], *, model: str, prompt_version: str) -> None:
        if self.down:
            raise StoreUnavailableError("cache down")
        self.entries.update({(*k, model, prompt_version): v for k, v in items.items()})


class FakeTime:
    """``sleep`` that only advances ``monotonic``: retry budgets are checked without waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += seconds

    def monotonic(self) -> float:
        with self._lock:
            return self.now


class RecordingBackpressure:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()

    @contextmanager
    def request(self, tokens: int, *, timeout_s: float) -> Iterator[None]:
        with self._lock:
            self.tokens.append(tokens)
        yield

    def record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as running:
        yield running


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def make(server: FakeChatServer, counter: TokenCounter, fake_time: FakeTime) -> Iterator[Any]:
    built: list[LlmContextualizer] = []

    def build(**overrides: Any) -> LlmContextualizer:
        options: dict[str, Any] = {
            "model": MODEL,
            "api_key": SecretStr("sk-test"),
            "base_url": server.base_url,
            "timeout_s": 2.0,
            "counter": counter,
            "max_retry_s": 5.0,
            "sleep": fake_time.sleep,
            "clock": fake_time.monotonic,
        }
        contextualizer = LlmContextualizer(**{**options, **overrides})
        built.append(contextualizer)
        return contextualizer

    yield build
    for contextualizer in built:
        contextualizer.close()


def chunk_of(prompt: str) -> str:
    return prompt[prompt.index("<chunk>\n") + len("<chunk>\n") : prompt.index("\n</chunk>")]


# -- the happy path --------------------------------------------------------------------------------------
def test_contexts_come_back_per_chunk_in_order(server: FakeChatServer, make: Any) -> None:
    requests = requests_for(CHUNKS)
    requests.append(ContextRequest("h0", CHUNKS[0]))  # a repeated chunk is asked for once

    outcomes = make().contexts(DOCUMENT, requests, doc_hash=DOC_HASH)

    assert [o.chunk_hash for o in outcomes] == ["h0", "h1", "h2", "h0"]
    assert all(o.error is None for o in outcomes)
    for outcome, request in zip(outcomes, requests, strict=True):
        assert outcome.context == fake_context(
            f"<document>\n{DOCUMENT}\n</document><chunk>{request.chunk_text}</chunk>"
        )
        assert outcome.context is not None and outcome.context.endswith("(in Shard rebalancing)")
    assert len(server.chat_requests()) == 3
    body = server.chat_requests()[0].json
    assert body["model"] == MODEL and body["temperature"] == 0 and body["max_tokens"] == MAX_ANSWER_TOKENS
    assert server.chat_requests()[0].bearer == "sk-test"


def test_the_document_comes_first_and_every_chunk_shares_the_same_prefix(server: FakeChatServer, make: Any) -> None:
    make().contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)

    prompts = server.prompts()
    assert [len(r.json["messages"]) for r in server.chat_requests()] == [1, 1, 1]
    assert all(p.startswith(f"<document>\n{DOCUMENT}\n</document>\n") for p in prompts)
    prefixes = {p[: p.index("<chunk>")] for p in prompts}
    assert len(prefixes) == 1
    assert sorted(chunk_of(p) for p in prompts) == sorted(CHUNKS)
    assert all(p.index("</document>") < p.index("<chunk>") for p in prompts)


def test_a_long_document_is_truncated_and_marked(server: FakeChatServer, make: Any, counter: TokenCounter) -> None:
    document = "# Long\n\n" + " ".join(f"word{i}" for i in range(2000)) + " THE-END"

    make(doc_token_budget=100).contexts(document, requests_for(["word5 word6"]), doc_hash=DOC_HASH)

    [prompt] = server.prompts()
    document_part = prompt[: prompt.index("</document>")]
    assert "document truncated: only its first 100 of" in document_part
    assert "THE-END" not in document_part and "word5" in document_part
    section = document_section(document, counter=counter, token_budget=100)
    assert section.truncated and section.text in prompt
    assert not document_section(DOCUMENT, counter=counter, token_budget=6000).truncated


def test_the_prompt_estimate_is_close_to_the_real_count(counter: TokenCounter) -> None:
    section = document_section(DOCUMENT, counter=counter, token_budget=6000)
    [message] = build_messages(section, CHUNKS[0])
    real = counter.count(str(message["content"]))
    assert real <= estimate_prompt_tokens(section, CHUNKS[0], counter=counter) <= real + 12


def test_contexts_are_stripped_and_capped(counter: TokenCounter) -> None:
    assert clean_context("  a context.\n ", counter=counter) == "a context."
    assert clean_context(" \n ", counter=counter) == "" and clean_context(None, counter=counter) == ""
    capped = clean_context("word " * 500, counter=counter, max_tokens=20)
    assert counter.count(capped) <= 20 and capped.startswith("word word")


# -- the cache -------------------------------------------------------------------------------------------
def test_cache_hits_skip_the_server(server: FakeChatServer, make: Any) -> None:
    cache = DictCache()
    cache.entries[(DOC_HASH, "h1", MODEL, PROMPT_VERSION)] = "cached context"
    cache.entries[(DOC_HASH, "h2", "other-model", PROMPT_VERSION)] = "another model's context"
    contextualizer = make(cache=cache)

    first = contextualizer.contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)

    assert first[1] == ContextOutcome("h1", "cached context", None)
    assert sorted(chunk_of(p) for p in server.prompts()) == sorted([CHUNKS[0], CHUNKS[2]])
    assert cache.entries[(DOC_HASH, "h0", MODEL, PROMPT_VERSION)] == first[0].context
    assert cache.entries[(DOC_HASH, "h2", MODEL, PROMPT_VERSION)] == first[2].context

    second = contextualizer.contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)

    assert second == first and len(server.chat_requests()) == 2
    contextualizer.contexts(DOCUMENT, requests_for(CHUNKS[:1]), doc_hash="doc-2")  # another document: a miss
    assert len(server.chat_requests()) == 3


def test_a_cache_that_is_down_costs_only_the_cache(server: FakeChatServer, make: Any) -> None:
    cache = DictCache()
    cache.down = True
    outcomes = make(cache=cache).contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)
    assert all(o.context for o in outcomes) and len(server.chat_requests()) == 3


def test_failed_contexts_are_not_cached(server: FakeChatServer, make: Any) -> None:
    cache = DictCache()
    server.fail_all, server.fail_status = True, 400
    outcomes = make(cache=cache).contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)
    assert all(o.context is None for o in outcomes) and cache.entries == {}


# -- retries and failures --------------------------------------------------------------------------------
def test_a_429_with_retry_after_is_waited_out_then_succeeds(
    server: FakeChatServer, make: Any, fake_time: FakeTime
) -> None:
    server.script(CHAT_COMPLETIONS, [Reply(status=429, headers={"Retry-After": "2"})])
    backpressure = RecordingBackpressure()

    [outcome] = make(backpressure=backpressure).contexts(DOCUMENT, requests_for(CHUNKS[:1]), doc_hash=DOC_HASH)

    assert outcome.context is not None and outcome.error is None
    assert len(server.chat_requests()) == 2
    assert len(fake_time.sleeps) == 1 and 2.0 <= fake_time.sleeps[0] <= 2.2
    assert [o.kind for o in backpressure.outcomes] == [OutcomeKind.RATE_LIMITED, OutcomeKind.SUCCESS]
    assert backpressure.outcomes[0].retry_after_s == 2.0
    assert len(backpressure.tokens) == 2 and backpressure.tokens[0] > 50  # a lease per attempt, sized by prompt


def test_a_5xx_is_retried_then_succeeds(server: FakeChatServer, make: Any, fake_time: FakeTime) -> None:
    server.script(CHAT_COMPLETIONS, [Reply(status=503), Reply(status=500)])
    backpressure = RecordingBackpressure()

    [outcome] = make(backpressure=backpressure).contexts(DOCUMENT, requests_for(CHUNKS[:1]), doc_hash=DOC_HASH)

    assert outcome.context is not None and len(server.chat_requests()) == 3 and len(fake_time.sleeps) == 2
    assert [o.kind for o in backpressure.outcomes] == [OutcomeKind.FAILED, OutcomeKind.FAILED, OutcomeKind.SUCCESS]


def test_a_400_fails_the_chunk_without_retrying(server: FakeChatServer, make: Any, fake_time: FakeTime) -> None:
    server.script(CHAT_COMPLETIONS, [Reply(status=400, json={"error": {"message": "context length exceeded"}})])

    outcomes = make(max_concurrent=1).contexts(DOCUMENT, requests_for(CHUNKS[:2]), doc_hash=DOC_HASH)

    assert outcomes[0].context is None and outcomes[0].error is not None
    # What the server said, which model at which endpoint refused, and the setting to look at.
    assert outcomes[0].error.startswith(f"chat completions ({MODEL} at {server.base_url}) rejected the request")
    assert "HTTP 400: context length exceeded" in outcomes[0].error and "context.model" in outcomes[0].error
    assert outcomes[1].context is not None  # only that chunk failed
    assert len(server.chat_requests()) == 2 and fake_time.sleeps == []


@pytest.mark.parametrize(("status", "hint"), [(401, "SHARDFUSE_CONTEXT__API_KEY"), (404, "context.base_url")])
def test_other_permanent_statuses_are_not_retried(server: FakeChatServer, make: Any, status: int, hint: str) -> None:
    server.fail_all, server.fail_status = True, status
    [outcome] = make().contexts(DOCUMENT, requests_for(CHUNKS[:1]), doc_hash=DOC_HASH)
    assert outcome.context is None and outcome.error is not None
    assert f"(HTTP {status}: injected failure)" in outcome.error and hint in outcome.error
    assert "sk-test" not in outcome.error
    assert len(server.chat_requests()) == 1


def test_a_client_timeout_fails_after_bounded_retries(server: FakeChatServer, make: Any, fake_time: FakeTime) -> None:
    server.hang_s = 10.0

    [outcome] = make(timeout_s=0.2, max_retry_s=1.0).contexts(DOCUMENT, requests_for(CHUNKS[:1]), doc_hash=DOC_HASH)

    assert outcome.context is None and outcome.error is not None and "timed out after 0.2s" in outcome.error
    attempts = len(server.chat_requests())
    assert 1 <= attempts <= 12 and len(fake_time.sleeps) == attempts - 1
    assert sum(fake_time.sleeps) <= 1.0  # never waits past the retry budget


def test_an_empty_answer_is_a_failure(server: FakeChatServer, make: Any, fake_time: FakeTime) -> None:
    server.script(CHAT_COMPLETIONS, [Reply.chat("  \n "), Reply.chat(None)])

    outcomes = make(max_concurrent=1).contexts(DOCUMENT, requests_for(CHUNKS[:2]), doc_hash=DOC_HASH)

    assert [o.context for o in outcomes] == [None, None]
    assert all(o.error == "empty answer (finish_reason=stop)" for o in outcomes)
    assert len(server.chat_requests()) == 2 and fake_time.sleeps == []


def test_injected_faults_are_retried_until_every_chunk_succeeds(make: Any, counter: TokenCounter) -> None:
    chunks = [f"chunk number {i} about shard moves" for i in range(12)]
    with FakeChatServer(error_rate_5xx=0.25, error_rate_429=0.15, retry_after_s=0.5, seed=7) as faulty:
        outcomes = make(base_url=faulty.base_url, max_retry_s=1000.0).contexts(
            DOCUMENT, requests_for(chunks), doc_hash=DOC_HASH
        )
        assert all(o.context for o in outcomes)
        assert len(faulty.chat_requests()) > len(chunks) and faulty.answered == len(chunks)


# -- budget, concurrency, a dying server -----------------------------------------------------------------
def test_an_exhausted_run_budget_fails_chunks_without_calls(server: FakeChatServer, make: Any) -> None:
    budget = RunBudget(100)
    outcomes = make(budget=budget).contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)
    assert outcomes == [ContextOutcome(f"h{i}", None, BUDGET_EXHAUSTED) for i in range(3)]
    assert server.chat_requests() == [] and budget.spent == 0


def test_the_run_budget_is_spent_chunk_by_chunk(server: FakeChatServer, make: Any, counter: TokenCounter) -> None:
    section = document_section(DOCUMENT, counter=counter, token_budget=6000)
    cost = [estimate_prompt_tokens(section, c, counter=counter) + MAX_ANSWER_TOKENS for c in CHUNKS]
    budget = RunBudget(cost[0] + cost[1])

    outcomes = make(budget=budget, max_concurrent=1).contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)

    assert [o.error for o in outcomes] == [None, None, BUDGET_EXHAUSTED]
    assert budget.spent == cost[0] + cost[1] and len(server.chat_requests()) == 2


def test_run_budget_is_thread_safe() -> None:
    budget = RunBudget(1000)
    taken: list[bool] = []
    threads = [threading.Thread(target=lambda: taken.extend(budget.take(1) for _ in range(200))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert taken.count(True) == 1000 and budget.spent == 1000 and budget.remaining == 0


def test_requests_run_concurrently_up_to_the_limit(make: Any) -> None:
    chunks = [f"chunk {i}" for i in range(12)]
    with FakeChatServer(latency_s=0.05) as slow:
        outcomes = make(base_url=slow.base_url, max_concurrent=3).contexts(DOCUMENT, requests_for(chunks), doc_hash="d")
        assert all(o.context for o in outcomes) and 2 <= slow.max_in_flight <= 3


def test_a_server_that_dies_mid_run_fails_the_remaining_chunks(make: Any, fake_time: FakeTime) -> None:
    chunks = [f"chunk {i} text" for i in range(6)]
    with FakeChatServer(stop_after=2) as dying:
        contextualizer = make(base_url=dying.base_url, max_concurrent=1, max_retry_s=1.0)
        outcomes = contextualizer.contexts(DOCUMENT, requests_for(chunks), doc_hash=DOC_HASH)

        assert [o.context is not None for o in outcomes] == [True, True, False, False, False, False]
        assert all(o.error is not None and "could not be reached" in o.error for o in outcomes[2:])
        assert dying.is_down and dying.answered == 2


def test_a_server_that_dies_under_concurrent_load_raises_nothing(make: Any) -> None:
    chunks = [f"chunk {i} text" for i in range(10)]
    with FakeChatServer(stop_after=3, latency_s=0.05) as dying:
        outcomes = make(base_url=dying.base_url, max_concurrent=4, max_retry_s=1.0).contexts(
            DOCUMENT, requests_for(chunks), doc_hash=DOC_HASH
        )
        assert len(outcomes) == 10 and sum(o.context is not None for o in outcomes) == dying.answered == 3


# -- under the ingest stage's per-document deadline --------------------------------------------------------
def test_a_model_that_stalls_past_the_documents_deadline_fails_the_document(server: FakeChatServer, make: Any) -> None:
    server.hang_s = 30.0  # far past both the deadline and the client's own timeout
    began = time.monotonic()
    with running_within(Deadline(0.5, what="[z] slow.md")), \
            pytest.raises(DeadlineExceededError, match=r"\[z\] slow.md ran past its 0.5s deadline .* chat model"):
        make(timeout_s=20.0, max_retry_s=60.0).contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)
    assert time.monotonic() - began < 5  # each request waited what the deadline left, not 20 s


def test_answers_that_came_back_before_the_deadline_are_cached(server: FakeChatServer, make: Any) -> None:
    cache = DictCache()
    requests = requests_for(CHUNKS)

    def stall_the_second_chunk(request: Received) -> Reply:
        prompt = prompt_of(request)
        return Reply.chat(fake_context(prompt), delay_s=30.0 if chunk_of(prompt) == CHUNKS[1] else 0.0)

    server.route(CHAT_COMPLETIONS, stall_the_second_chunk)
    with running_within(Deadline(1.0)), pytest.raises(DeadlineExceededError):
        make(cache=cache, max_concurrent=4).contexts(DOCUMENT, requests, doc_hash=DOC_HASH)
    # A retry of the document asks the model only for what the deadline cut short.
    assert {chunk_hash for (_, chunk_hash, _, _) in cache.entries} == {"h0", "h2"}


def test_without_a_deadline_a_failing_model_still_means_backfill_not_an_error(
    server: FakeChatServer, make: Any, fake_time: FakeTime
) -> None:
    server.fail_all = True
    with running_within(Deadline(60.0)):
        outcomes = make(max_retry_s=2.0).contexts(DOCUMENT, requests_for(CHUNKS), doc_hash=DOC_HASH)
    assert all(o.context is None and o.error for o in outcomes)
