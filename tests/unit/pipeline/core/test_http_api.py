"""The one client for OpenAI-compatible APIs under the one retry policy: the real ``openai`` SDK against a
local server, with a fake clock for the waits (nothing sleeps; every attempt is a real HTTP request)."""

from __future__ import annotations

from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import pytest
from openai.types.chat import ChatCompletion
from pydantic import SecretStr

from shardfuse.pipeline.core.errors import (
    EmbeddingProviderError,
    EmbeddingRequestError,
    PermanentError,
    RateLimitedError,
    TransientError,
)
from shardfuse.pipeline.core.http_api import Endpoint, OpenAIApi, call_with_retries, retry_after_s
from tests.support.openai_server import CHAT_COMPLETIONS, FakeOpenAIServer, Reply, error_body

KEY = "sk-shared-client-test-key"
MESSAGES = [{"role": "user", "content": "hello"}]


class FakeTime:
    """The retry policy's clock and sleep: sleeping only advances the clock, and is recorded."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.rate_limited: list[float | None] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as running:
        yield running


@pytest.fixture
def api(server: FakeOpenAIServer) -> Iterator[OpenAIApi]:
    client = OpenAIApi(Endpoint("chat completions", "chat-model", "context", server.base_url), api_key=SecretStr(KEY),
                       timeout_s=5.0)  # fmt: skip
    yield client
    client.close()


def ask(api: OpenAIApi, fake: FakeTime, *, max_retry_s: float = 60.0, **options: Any) -> ChatCompletion:
    """One chat completion through the client, under the shared retry policy on ``fake``'s clock."""
    return call_with_retries(
        lambda: api.chat_completion(model="chat-model", messages=MESSAGES),
        max_retry_s=max_retry_s,
        on_rate_limited=fake.rate_limited.append,
        sleep=fake.sleep,
        clock=fake.clock,
        **options,
    )


def refusal(status: int, message: str, **headers: str) -> Reply:
    return Reply(status=status, json=error_body(status, message), headers=headers)


# -- waits: Retry-After, backoff, the budget -------------------------------------------------------------


def test_a_429_with_retry_after_is_waited_out_then_the_call_succeeds(server: FakeOpenAIServer, api: OpenAIApi) -> None:
    server.script(CHAT_COMPLETIONS, [refusal(429, "slow down", **{"Retry-After": "3"})])
    fake = FakeTime()

    response = ask(api, fake)

    assert response.choices[0].message.content == "hello"
    assert len(server.requests(CHAT_COMPLETIONS)) == 2
    assert len(fake.sleeps) == 1 and 3.0 <= fake.sleeps[0] <= 3.3  # at least the wait asked for, jittered up
    assert fake.rate_limited == [3.0]


def test_a_503_naming_a_wait_is_waited_out_but_is_not_a_rate_limit(server: FakeOpenAIServer, api: OpenAIApi) -> None:
    server.script(CHAT_COMPLETIONS, [refusal(503, "overloaded", **{"retry-after-ms": "1500"})])
    fake = FakeTime()

    ask(api, fake)

    assert len(server.requests(CHAT_COMPLETIONS)) == 2
    assert len(fake.sleeps) == 1 and 1.5 <= fake.sleeps[0] <= 1.65
    assert fake.rate_limited == []  # the backpressure layer slows down for 429s only


def test_persistent_5xx_backs_off_with_jitter_until_the_budget_is_spent(
    server: FakeOpenAIServer, api: OpenAIApi
) -> None:
    server.route(CHAT_COMPLETIONS, lambda _: refusal(500, "the model crashed"))
    fake = FakeTime()

    with pytest.raises(EmbeddingProviderError) as raised:
        ask(api, fake, max_retry_s=20.0)

    attempts = len(server.requests(CHAT_COMPLETIONS))
    assert attempts == len(fake.sleeps) + 1 >= 4
    # Full jitter: the n-th wait is drawn from [0, 0.5 × 2^(n-1)]; no wait ends past the budget.
    assert all(0 <= wait <= 0.5 * 2**n for n, wait in enumerate(fake.sleeps))
    assert sum(fake.sleeps) <= 20.0
    message = str(raised.value)
    assert not isinstance(raised.value, RateLimitedError)
    assert "HTTP 500" in message and "the model crashed" in message and "chat-model" in message
    assert server.base_url in message


def test_max_attempts_bounds_the_retries(server: FakeOpenAIServer, api: OpenAIApi) -> None:
    server.route(CHAT_COMPLETIONS, lambda _: refusal(502, "bad gateway"))
    fake = FakeTime()
    with pytest.raises(EmbeddingProviderError, match="HTTP 502"):
        ask(api, fake, max_attempts=2)
    assert len(server.requests(CHAT_COMPLETIONS)) == 2 and len(fake.sleeps) == 1


def test_a_retry_after_beyond_the_budget_is_not_waited_for(server: FakeOpenAIServer, api: OpenAIApi) -> None:
    server.route(CHAT_COMPLETIONS, lambda _: refusal(429, "come back later", **{"Retry-After": "600"}))
    fake = FakeTime()
    with pytest.raises(RateLimitedError) as raised:
        ask(api, fake, max_retry_s=120.0)
    assert raised.value.retry_after_s == 600.0 and "retry after 600s" in str(raised.value)
    assert len(server.requests(CHAT_COMPLETIONS)) == 1 and fake.sleeps == [] and fake.rate_limited == [600.0]


# -- permanent failures: one attempt, a message a person can act on ---------------------------------------


@pytest.mark.parametrize(
    ("section", "variable"),
    [("context", "SHARDFUSE_CONTEXT__API_KEY"), ("query.expansion", "SHARDFUSE_QUERY__EXPANSION__API_KEY"),
     ("embedder", "SHARDFUSE_EMBEDDER__API_KEY")],
)  # fmt: skip
def test_a_401_is_permanent_not_retried_and_names_the_key_to_fix(
    server: FakeOpenAIServer, section: str, variable: str
) -> None:
    # A server that repeats the key it refused: the message must not.
    server.route(CHAT_COMPLETIONS, lambda _: refusal(401, f"Incorrect API key provided: {KEY}"))
    api = OpenAIApi(Endpoint("chat completions", "chat-model", section, server.base_url), api_key=SecretStr(KEY),
                    timeout_s=5.0)  # fmt: skip
    fake = FakeTime()

    with pytest.raises(EmbeddingRequestError) as raised:
        ask(api, fake)
    api.close()

    assert isinstance(raised.value, PermanentError) and raised.value.status == 401
    assert len(server.requests(CHAT_COMPLETIONS)) == 1 and fake.sleeps == []
    message = str(raised.value)
    assert message.startswith(f"chat completions (chat-model at {server.base_url}) rejected the API key")
    assert "HTTP 401: Incorrect API key provided: ***)" in message and variable in message
    assert KEY not in message and KEY not in repr(api)


@pytest.mark.parametrize(
    ("status", "hints"),
    [(400, ["context.model"]), (403, ["permissions", "context.model"]),
     (404, ["context.model", "context.base_url"]), (422, ["context.model", "inputs"]), (418, ["refused"])],
)  # fmt: skip
def test_other_client_errors_are_permanent_with_a_hint(
    server: FakeOpenAIServer, api: OpenAIApi, status: int, hints: list[str]
) -> None:
    server.script(CHAT_COMPLETIONS, [refusal(status, "the server says no")])
    with pytest.raises(EmbeddingRequestError) as raised:
        ask(api, FakeTime())
    assert raised.value.status == status and len(server.requests(CHAT_COMPLETIONS)) == 1
    assert f"HTTP {status}: the server says no" in str(raised.value)
    assert all(hint in str(raised.value) for hint in hints)


@pytest.mark.parametrize("status", [408, 409])
def test_request_timeout_and_conflict_are_the_servers_trouble(
    server: FakeOpenAIServer, api: OpenAIApi, status: int
) -> None:
    server.script(CHAT_COMPLETIONS, [refusal(status, "try again")])
    ask(api, FakeTime())
    assert len(server.requests(CHAT_COMPLETIONS)) == 2


# -- one attempt per call: what the client itself does ------------------------------------------------------


def test_the_sdk_makes_one_request_and_sends_the_key(server: FakeOpenAIServer, api: OpenAIApi) -> None:
    server.script(CHAT_COMPLETIONS, [refusal(500, "boom")])
    with pytest.raises(EmbeddingProviderError):
        api.chat_completion(model="chat-model", messages=MESSAGES)
    [request] = server.requests(CHAT_COMPLETIONS)  # the SDK's own retries are off
    assert request.bearer == KEY and request.json["model"] == "chat-model"


def test_an_empty_key_is_sent_as_a_placeholder(server: FakeOpenAIServer) -> None:
    api = OpenAIApi(Endpoint("chat completions", "m", "context", server.base_url), api_key=SecretStr(""),
                    timeout_s=5.0)  # fmt: skip
    api.chat_completion(model="m", messages=MESSAGES)
    api.close()
    assert server.requests(CHAT_COMPLETIONS)[0].bearer == "unset"


def test_a_timeout_is_transient_and_says_how_long_it_waited(server: FakeOpenAIServer, api: OpenAIApi) -> None:
    server.script(CHAT_COMPLETIONS, [Reply.chat("late", delay_s=3.0)])
    with pytest.raises(EmbeddingProviderError, match=r"timed out after 0\.3s"):
        api.chat_completion(model="chat-model", messages=MESSAGES, timeout_s=0.3)


def test_an_unreachable_server_is_transient() -> None:
    with FakeOpenAIServer() as stopped:
        base_url = stopped.base_url
    api = OpenAIApi(Endpoint("chat completions", "m", "context", base_url), api_key=SecretStr(KEY), timeout_s=2.0)
    with pytest.raises(EmbeddingProviderError, match="could not be reached") as raised:
        api.chat_completion(model="m", messages=MESSAGES)
    assert isinstance(raised.value, TransientError)


def test_a_200_that_is_not_a_completion_is_transient(server: FakeOpenAIServer, api: OpenAIApi) -> None:
    server.script(CHAT_COMPLETIONS, [Reply(body=b"<html>proxy</html>", headers={"Content-Type": "text/html"})])
    with pytest.raises(EmbeddingProviderError, match="something other than a response"):
        api.chat_completion(model="chat-model", messages=MESSAGES)


def test_a_base_url_password_never_reaches_a_message() -> None:
    endpoint = Endpoint("chat completions", "m", "context", "https://user:hunter2@llm.example/v1")
    assert str(endpoint) == "chat completions (m at https://user:***@llm.example/v1)"
    assert str(Endpoint("OpenAI embeddings", "text-embedding-3-small", "embedder")) == (
        "OpenAI embeddings (text-embedding-3-small)"
    )


# -- Retry-After headers -------------------------------------------------------------------------------------


def test_retry_after_parsing() -> None:
    now = 1_700_000_000.0
    assert retry_after_s({"Retry-After": "3"}, now=now) == 3.0
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}, now=now) == 1.5
    assert retry_after_s({"Retry-After": formatdate(now + 20, usegmt=True)}, now=now) == pytest.approx(20, abs=1)
    assert retry_after_s({"Retry-After": formatdate(now - 20, usegmt=True)}, now=now) == 0.0
    assert retry_after_s({"Retry-After": "soon"}, now=now) is None
    assert retry_after_s({}, now=now) is None and retry_after_s(None) is None
