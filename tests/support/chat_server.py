"""A local HTTP server speaking OpenAI's chat completions API, for the real SDK: contextual retrieval tests.

Answers are a deterministic function of the prompt: ``"Context: <first words of the chunk> (in <the
document's first heading>)"``, where the chunk is the text between the last ``<chunk>`` and ``</chunk>`` of
the last message and the heading the first Markdown heading between ``<document>`` and ``</document>``.
Scripted replies (:meth:`FakeOpenAIServer.script`) still come first, before faults and answers.

Load behaviour is configurable, all attributes that may change while it runs: ``latency_s``, seeded
random 429s (with ``Retry-After``) and 5xx, ``fail_all`` (every request answered ``fail_status``),
``hang_s`` (replies held back that long, for client timeouts). :meth:`go_down` (or ``stop_after``) makes it
behave like a crashed server: from then on every request, and every reply still being held back, ends with
the connection closed and no response::

    with FakeChatServer(latency_s=0.02, stop_after=3) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        ...
        assert server.answered == 3 and server.max_in_flight <= 4
"""

from __future__ import annotations

import random
import re
import threading
from http.server import BaseHTTPRequestHandler
from typing import cast

from tests.support.openai_server import (
    CHAT_COMPLETIONS,
    DEFAULT_MODEL,
    FakeOpenAIServer,
    Received,
    Reply,
    chat_completion,
    error_body,
)

_CHUNK = re.compile(r"<chunk>\n?(.*?)\n?</chunk>", re.DOTALL)
_DOCUMENT = re.compile(r"<document>\n?(.*?)\n?</document>", re.DOTALL)
_HEADING = re.compile(r"^#+\s+(.+?)\s*$", re.MULTILINE)
ANSWER_WORDS = 6


class _Disconnect(Exception):
    """Raised inside a request to close its connection without a response (the server "crashed")."""


def fake_context(prompt: str) -> str:
    """The server's answer to ``prompt`` (see the module docstring)."""
    chunks = _CHUNK.findall(prompt)
    words = chunks[-1].split()[:ANSWER_WORDS] if chunks else prompt.split()[:ANSWER_WORDS]
    document = _DOCUMENT.search(prompt)
    heading = _HEADING.search(document.group(1)) if document else None
    return f"Context: {' '.join(words)} (in {heading.group(1) if heading else 'an untitled document'})"


def prompt_of(request: Received) -> str:
    """The content of the last message of a chat request ("" when there is none)."""
    body = request.json if isinstance(request.json, dict) else {}
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content", "")
    return content if isinstance(content, str) else ""


class FakeChatServer(FakeOpenAIServer):
    """:class:`FakeOpenAIServer` with a deterministic chat route, fault injection and a crash switch."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        error_rate_429: float = 0.0,
        error_rate_5xx: float = 0.0,
        retry_after_s: float = 1.0,
        fail_all: bool = False,
        fail_status: int = 500,
        hang_s: float = 0.0,
        stop_after: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__({CHAT_COMPLETIONS: self._chat})
        # Every connection gets a handler of this class: swapped before serving starts.
        base_handler = cast("type[BaseHTTPRequestHandler]", self._httpd.RequestHandlerClass)
        self._httpd.RequestHandlerClass = _closing_on_disconnect(base_handler)
        self.latency_s = latency_s
        self.error_rate_429 = error_rate_429
        self.error_rate_5xx = error_rate_5xx
        self.retry_after_s = retry_after_s
        self.fail_all = fail_all
        self.fail_status = fail_status
        self.hang_s = hang_s
        self.stop_after = stop_after
        self._random = random.Random(seed)
        self._state = threading.Lock()
        self._down = threading.Event()
        self._in_flight = 0
        self._max_in_flight = 0
        self._answered = 0

    # -- what it observed --------------------------------------------------------------------------------
    @property
    def answered(self) -> int:
        """How many chat completions it answered successfully (scripted replies not counted)."""
        with self._state:
            return self._answered

    @property
    def max_in_flight(self) -> int:
        """The most requests it was handling at once."""
        with self._state:
            return self._max_in_flight

    @property
    def is_down(self) -> bool:
        return self._down.is_set()

    def chat_requests(self) -> list[Received]:
        """The requests to the chat route, oldest first (not those that arrived after it went down)."""
        return self.requests(CHAT_COMPLETIONS)

    def prompts(self) -> list[str]:
        """The last message of every chat request, oldest first."""
        return [prompt_of(request) for request in self.chat_requests()]

    # -- control -------------------------------------------------------------------------------------------
    def go_down(self) -> None:
        """Behave like a crashed server from now on (see the module docstring)."""
        self._down.set()

    def come_back(self) -> None:
        """Answer again, as a server restarted on the same address would (and forget ``stop_after``)."""
        self.stop_after = None
        self._down.clear()

    def __enter__(self) -> FakeChatServer:
        self.start()
        return self

    def stop(self) -> None:
        self._down.set()  # wakes replies still being held back, which then close their connections
        super().stop()

    # -- serving -----------------------------------------------------------------------------------------
    def _respond(self, request: Received) -> Reply:
        if self._down.is_set():
            raise _Disconnect
        with self._state:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            return super()._respond(request)
        finally:
            with self._state:
                self._in_flight -= 1

    def _chat(self, request: Received) -> Reply:
        self._hold(self.latency_s + self.hang_s)
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        body = request.json if isinstance(request.json, dict) else {}
        if not body.get("messages"):
            return Reply(status=400, json=error_body(400, "messages must be a non-empty list"))
        with self._state:
            if self._down.is_set():  # went down while this request was held back or being checked
                raise _Disconnect
            self._answered += 1
            if self.stop_after is not None and self._answered >= self.stop_after:
                self._down.set()  # this reply still goes out; nothing after it does
        prompt = prompt_of(request)
        answer = fake_context(prompt)
        completion = chat_completion(answer, model=str(body.get("model", DEFAULT_MODEL)))
        completion["usage"] = _usage(prompt, answer)
        return Reply(json=completion)

    def _hold(self, seconds: float) -> None:
        if seconds > 0 and self._down.wait(seconds):
            raise _Disconnect

    def _refusal(self) -> Reply | None:
        if self.fail_all:
            return Reply(status=self.fail_status, json=error_body(self.fail_status, "injected failure"))
        with self._state:
            roll = self._random.random()
        if roll < self.error_rate_5xx:
            return Reply(status=500, json=error_body(500, "injected server error"))
        if roll < self.error_rate_5xx + self.error_rate_429:
            headers = {"Retry-After": f"{self.retry_after_s:g}"}
            return Reply(status=429, json=error_body(429, "injected rate limit"), headers=headers)
        return None


def _usage(prompt: str, answer: str) -> dict[str, int]:
    prompt_tokens, completion_tokens = max(1, len(prompt) // 4), max(1, len(answer) // 4)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _closing_on_disconnect(base: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    """``base`` whose requests end with the connection closed, unanswered, when they raise :class:`_Disconnect`
    (instead of a traceback from the server's error handler)."""

    class Handler(base):  # type: ignore[valid-type,misc]
        def do_POST(self) -> None:
            try:
                super().do_POST()
            except _Disconnect:
                self.close_connection = True

        def do_GET(self) -> None:
            try:
                super().do_GET()
            except _Disconnect:
                self.close_connection = True

    return Handler
