"""A local HTTP server that speaks enough of the OpenAI API for the real ``openai`` client.

Tests point a real SDK client at :attr:`FakeOpenAIServer.base_url` instead of patching it, so retries,
timeouts, headers and response parsing are exercised for real. Each route (a path) has a default responder;
:meth:`FakeOpenAIServer.script` queues replies that are served first, one per request, in order::

    with FakeOpenAIServer() as server:
        server.script(CHAT_COMPLETIONS, [Reply(status=429, headers={"Retry-After": "0"}), Reply.chat("{}")])
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test")
        ...
        assert server.requests(CHAT_COMPLETIONS)[0].bearer == "sk-test"

New endpoints are new routes: ``server.route("/v1/embeddings", responder)`` (OpenAI and Voyage both use that
path; run one server per provider).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CHAT_COMPLETIONS = "/v1/chat/completions"
DEFAULT_MODEL = "fake-model"


@dataclass(frozen=True)
class Received:
    """One request as the server saw it; header names are lower-cased."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any  # the parsed body, or None when it is not JSON

    @property
    def bearer(self) -> str | None:
        """The API key from ``Authorization: Bearer <key>``."""
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token if scheme.lower() == "bearer" else None


@dataclass(frozen=True)
class Reply:
    """One HTTP response. ``json`` is sent as JSON; ``body`` as raw bytes (for garbage); with neither, an
    error status gets an OpenAI-shaped error body. ``delay_s`` holds the response back (for timeouts)."""

    status: int = 200
    json: Any = None
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0

    @classmethod
    def chat(cls, content: str | None, *, model: str = DEFAULT_MODEL, delay_s: float = 0.0) -> Reply:
        """A successful chat completion whose single choice says ``content``."""
        return cls(json=chat_completion(content, model=model), delay_s=delay_s)

    def encoded(self) -> tuple[bytes, str]:
        """The body and its content type."""
        if self.body is not None:
            return self.body, self.headers.get("Content-Type", "application/octet-stream")
        payload = self.json if self.json is not None or self.status < 400 else error_body(self.status)
        return json.dumps(payload).encode(), "application/json"


Responder = Callable[[Received], Reply]


def chat_completion(content: str | None, *, model: str = DEFAULT_MODEL, finish_reason: str = "stop") -> dict[str, Any]:
    """A ``chat.completion`` object as the API returns it."""
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


def error_body(status: int, message: str | None = None) -> dict[str, Any]:
    """The API's error envelope for ``status``."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    return {"error": {"message": message or phrase, "type": "fake_server_error", "param": None, "code": str(status)}}


def echo_chat(request: Received) -> Reply:
    """The default chat responder: answers with the last message's content, in the requested model's name."""
    body = request.json if isinstance(request.json, dict) else {}
    messages = body.get("messages") or [{}]
    return Reply.chat(str(messages[-1].get("content", "")), model=str(body.get("model", DEFAULT_MODEL)))


class FakeOpenAIServer:
    """A threaded HTTP server on 127.0.0.1 (a free port); use it as a context manager."""

    def __init__(self, routes: Mapping[str, Responder] | None = None) -> None:
        self._routes: dict[str, Responder] = {CHAT_COMPLETIONS: echo_chat, **(routes or {})}
        self._scripts: dict[str, deque[Reply | Responder]] = {}
        self._received: list[Received] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        # A short poll interval: shutdown() waits for it, once per test.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai", daemon=True
        )

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes replies still being delayed
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- configuration ---------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """What to give the SDK as ``base_url`` (it appends ``/chat/completions`` and the like)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def route(self, path: str, responder: Responder) -> None:
        """Answer requests to ``path`` with ``responder`` once its script, if any, is used up."""
        with self._lock:
            self._routes[path] = responder

    def script(self, path: str, replies: Iterable[Reply | Responder]) -> None:
        """Queue ``replies`` for ``path``: each request takes the next one, before the default responder."""
        with self._lock:
            self._scripts.setdefault(path, deque()).extend(replies)

    def requests(self, path: str | None = None) -> list[Received]:
        """The requests received so far (to ``path`` only, when given), oldest first."""
        with self._lock:
            return [r for r in self._received if path is None or r.path == path]

    # -- serving ---------------------------------------------------------------------------------------
    def _respond(self, request: Received) -> Reply:
        with self._lock:
            self._received.append(request)
            script = self._scripts.get(request.path)
            scripted = script.popleft() if script else None
            responder = self._routes.get(request.path)
        if isinstance(scripted, Reply):
            return scripted
        if scripted is not None:
            return scripted(request)
        if responder is None:
            return Reply(status=404, json=error_body(404, f"no route for {request.method} {request.path}"))
        return responder(request)

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


def _handler_for(server: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the real API; every reply has a Content-Length

        def do_GET(self) -> None:
            self._handle()

        def do_POST(self) -> None:
            self._handle()

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                parsed = json.loads(body) if body else None
            except ValueError:
                parsed = None
            path = self.path.split("?", 1)[0]
            request = Received(
                method=self.command,
                path=path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                json=parsed,
            )
            reply = server._respond(request)
            if reply.delay_s:
                server._wait(reply.delay_s)
            payload, content_type = reply.encoded()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers.items():
                    if name.lower() not in ("content-type", "content-length"):
                        self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up waiting (a timeout test)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return  # keep test output clean

    return Handler
