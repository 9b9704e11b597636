"""A local HTTP server speaking the embeddings APIs of OpenAI and Voyage, for the real SDKs.

Both SDKs post to ``<base_url>/embeddings`` with nearly the same JSON, so one route serves both: the reply
carries what each SDK reads (OpenAI's ``usage.prompt_tokens``, Voyage's ``usage.total_tokens``; error
bodies hold OpenAI's ``{"error": {...}}`` and Voyage's ``{"detail": ...}``), and ``encoding_format`` is
honoured (the voyageai SDK asks for base64 float32 unless told otherwise).

Vectors are a deterministic function of each input's text and the requested size (a seeded normal draw,
unit length unless ``normalize=False``). Load behaviour is configurable: latency, a concurrency quota and a
per-minute request quota (both answered 429 with ``Retry-After``), and seeded random 5xx and 429 faults.
Scripted replies (:meth:`FakeOpenAIServer.script`) still come first, before quotas and faults::

    with FakeEmbeddingsServer(dimensions=32, latency_s=0.05, max_concurrent=4) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        ...
        assert server.max_in_flight <= 4 and server.embedded_inputs == 10
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from tests.support.openai_server import FakeOpenAIServer, Received, Reply, error_body

EMBEDDINGS = "/v1/embeddings"
# ThreadingHTTPServer listens with a backlog of 5: a burst of connections beyond it is refused or reset.
_LISTEN_BACKLOG = 512


def fake_vector(text: str, dimensions: int, *, normalize: bool = True) -> list[float]:
    """The fake server's embedding of ``text``: the same for the same text and size, in any process."""
    seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")
    vector = np.random.default_rng(seed).standard_normal(dimensions)
    if normalize:
        vector /= np.linalg.norm(vector)
    return [float(x) for x in vector.astype(np.float32)]


def embeddings_error(status: int, message: str, *, headers: dict[str, str] | None = None) -> Reply:
    """An error reply both SDKs read: OpenAI's error envelope plus Voyage's ``detail``."""
    body = error_body(status, message)
    body["detail"] = message
    return Reply(status=status, json=body, headers=headers or {})


class FakeEmbeddingsServer(FakeOpenAIServer):
    """:class:`FakeOpenAIServer` with an embeddings route, quotas and fault injection (thread-safe)."""

    def __init__(
        self,
        *,
        dimensions: int = 16,
        normalize: bool = True,
        latency_s: float = 0.0,
        max_concurrent: int | None = None,
        requests_per_minute: int | None = None,
        error_rate_5xx: float = 0.0,
        error_rate_429: float = 0.0,
        retry_after_s: float = 1.0,
        shuffle: bool = False,
        floats_only: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__({EMBEDDINGS: self._embeddings})
        self._httpd.socket.listen(_LISTEN_BACKLOG)
        self.dimensions = dimensions
        self.normalize = normalize
        self.latency_s = latency_s
        self.max_concurrent = max_concurrent
        self.requests_per_minute = requests_per_minute
        self.error_rate_5xx = error_rate_5xx
        self.error_rate_429 = error_rate_429
        self.retry_after_s = retry_after_s
        self.shuffle = shuffle
        self.floats_only = floats_only  # answer with float lists whatever encoding_format asks (as some servers do)
        self._random = random.Random(seed)
        self._state = threading.Lock()
        self._local = threading.local()
        self._in_flight = 0
        self._max_in_flight = 0
        self._embedded_inputs = 0
        self._admitted: deque[float] = deque()  # monotonic times of requests inside the per-minute window

    # -- what it observed --------------------------------------------------------------------------------
    @property
    def max_in_flight(self) -> int:
        """The most requests it was handling at once."""
        with self._state:
            return self._max_in_flight

    @property
    def embedded_inputs(self) -> int:
        """How many inputs it has embedded (successful replies only)."""
        with self._state:
            return self._embedded_inputs

    def embedding_requests(self) -> list[Received]:
        """The requests to the embeddings route, oldest first."""
        return self.requests(EMBEDDINGS)

    # -- serving -----------------------------------------------------------------------------------------
    def _respond(self, request: Received) -> Reply:
        # Counted around the whole reply, latency included: that is what "in flight" means to a client.
        with self._state:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._local.over_quota = self.max_concurrent is not None and self._in_flight > self.max_concurrent
        try:
            return super()._respond(request)
        finally:
            with self._state:
                self._in_flight -= 1

    def _embeddings(self, request: Received) -> Reply:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        body = request.json if isinstance(request.json, dict) else {}
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) and t for t in inputs):
            return embeddings_error(400, "input must be a non-empty string or a list of non-empty strings")
        size = body.get("dimensions") or body.get("output_dimension") or self.dimensions
        as_base64 = body.get("encoding_format") == "base64" and not self.floats_only
        data = [
            {"object": "embedding", "index": i, "embedding": self._encode(text, int(size), as_base64)}
            for i, text in enumerate(inputs)
        ]
        if self.shuffle:
            with self._state:
                self._random.shuffle(data)
        tokens = sum(max(1, len(text) // 4) for text in inputs)
        if self.latency_s:
            self._wait(self.latency_s)
        with self._state:
            self._embedded_inputs += len(inputs)
        return Reply(
            json={
                "object": "list",
                "data": data,
                "model": str(body.get("model", "")),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    def _refusal(self) -> Reply | None:
        """A 429 or 5xx for this request when a quota or an injected fault says so, else None."""
        now = time.monotonic()
        with self._state:
            if getattr(self._local, "over_quota", False):
                return self._too_many("too many concurrent requests", self.retry_after_s)
            if self.requests_per_minute is not None:
                while self._admitted and now - self._admitted[0] >= 60.0:
                    self._admitted.popleft()
                if len(self._admitted) >= self.requests_per_minute:
                    wait = max(1, math.ceil(60.0 - (now - self._admitted[0])))
                    return self._too_many("requests per minute exceeded", wait)
                self._admitted.append(now)
            roll = self._random.random()
        if roll < self.error_rate_5xx:
            return embeddings_error(500, "injected server error")
        if roll < self.error_rate_5xx + self.error_rate_429:
            return self._too_many("injected rate limit", self.retry_after_s)
        return None

    def _too_many(self, message: str, retry_after: float) -> Reply:
        return embeddings_error(429, message, headers={"Retry-After": f"{retry_after:g}"})

    def _encode(self, text: str, size: int, as_base64: bool) -> Any:
        vector = fake_vector(text, size, normalize=self.normalize)
        if as_base64:
            return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        return vector
