"""A local HTTP server speaking the rerank APIs of Voyage, Cohere, Jina and text-embeddings-inference (TEI).

Real clients are pointed at it: the ``voyageai`` SDK at :attr:`FakeRerankServer.base_url` (it posts to
``<base>/rerank``, here ``/v1/rerank``), the Cohere and Jina shapes at :attr:`FakeRerankServer.root_url`
(``/v1/rerank``) and TEI's at the same root (``/rerank``). One ``/v1/rerank`` route answers Voyage, Cohere and
Jina alike: the reply carries Voyage's ``data`` and ``usage`` and Cohere/Jina's ``results``, best first as the
real APIs sort them. Error replies carry Cohere's ``message``, Voyage's and Jina's ``detail``.

A text's score is :func:`overlap_score`: the share of the query's words it contains, so a test knows the
order to expect. Faults are scripted replies (:meth:`FakeOpenAIServer.script`), served before the default::

    with FakeRerankServer() as server:
        server.script(RERANK, [rerank_error(429, "slow down", retry_after="0.05")])
        ...
        assert server.requests(RERANK)[0].json["documents"] == [...]
"""

from __future__ import annotations

import re
from typing import Any

from tests.support.openai_server import FakeOpenAIServer, Received, Reply

RERANK = "/v1/rerank"  # Voyage (under its /v1 base), Cohere, Jina
TEI_RERANK = "/rerank"
_WORD = re.compile(r"\w+")


def overlap_score(query: str, text: str) -> float:
    """The share of ``query``'s distinct words that ``text`` contains (0 to 1)."""
    wanted = {w.lower() for w in _WORD.findall(query)}
    found = {w.lower() for w in _WORD.findall(text)}
    return len(wanted & found) / len(wanted) if wanted else 0.0


def rerank_error(status: int, message: str, *, retry_after: str | None = None) -> Reply:
    """An error reply every client reads its message from."""
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Reply(status=status, json={"message": message, "detail": message}, headers=headers)


class FakeRerankServer(FakeOpenAIServer):
    """Scores every text it is sent by :func:`overlap_score`; thread-safe, on 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__({RERANK: self._rerank, TEI_RERANK: self._tei})

    @property
    def root_url(self) -> str:
        """The server without a path: the base URL of the Cohere, Jina and TEI shapes."""
        return self.base_url.removesuffix("/v1")

    def _rerank(self, request: Received) -> Reply:
        body = request.json if isinstance(request.json, dict) else {}
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list) or not documents:
            return rerank_error(400, "query must be a string and documents a non-empty list")
        ranked = _ranked(query, [str(d) for d in documents])
        top = body.get("top_n") or body.get("top_k") or len(ranked)
        scored = [{"index": i, "relevance_score": score} for i, score in ranked[: int(top)]]
        return Reply(json={
            "object": "list", "data": scored, "model": str(body.get("model", "")),
            "usage": {"total_tokens": sum(len(str(d)) // 4 + 1 for d in documents)},
            "id": "rerank-1", "results": scored, "meta": {"billed_units": {"search_units": 1}},
        })

    def _tei(self, request: Received) -> Reply:
        body = request.json if isinstance(request.json, dict) else {}
        query, texts = body.get("query"), body.get("texts")
        if not isinstance(query, str) or not isinstance(texts, list) or not texts:
            return Reply(status=422, json={"error": "query must be a string and texts a non-empty list",
                                           "error_type": "Validation"})
        return Reply(json=[{"index": i, "score": score} for i, score in _ranked(query, [str(t) for t in texts])])


def _ranked(query: str, texts: list[str]) -> list[tuple[int, Any]]:
    """Indexes with their scores, best first (ties by index)."""
    return sorted(((i, overlap_score(query, t)) for i, t in enumerate(texts)), key=lambda pair: (-pair[1], pair[0]))
