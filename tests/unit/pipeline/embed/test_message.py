"""A message of chunked documents through the embed stage (shardfuse.pipeline.embed.message): each under its
document lease (the real leases, on fakeredis), all handed to the batcher before any is waited for, each
settled on its own."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import fakeredis
import pytest

from shardfuse.pipeline.coordination.leases import DocumentLeases
from shardfuse.pipeline.coordination.liveness import alive_key
from shardfuse.pipeline.core.documents import Chunk, PreparedDocument
from shardfuse.pipeline.core.errors import DocumentBusyError, EmbeddingProviderError, LeaseLostError, TransientError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.message import embed_message
from shardfuse.pipeline.index.store import ApplyOutcome


class FakeBatcher:
    """Records what it is given and answers each document as ``answers`` says: an outcome, an error, or
    nothing at all (``None``: the batch never commits)."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.answers = answers or {}
        self.submitted: list[tuple[str, int | None]] = []
        self.futures: list[Future[ApplyOutcome]] = []

    def submit(self, document: PreparedDocument, *, fence: int | None = None) -> Future[ApplyOutcome]:
        self.submitted.append((document.event.path, fence))
        future: Future[ApplyOutcome] = Future()
        self.futures.append(future)
        answer = self.answers.get(document.event.path, "applied")
        key, seq = document.event.key, document.event.seq
        if answer == "applied":
            future.set_result(ApplyOutcome(key, seq, True, None))
        elif answer == "stale":
            future.set_result(ApplyOutcome(key, seq, False, seq))
        elif isinstance(answer, int):  # the shard has seen this newer lease token
            future.set_result(ApplyOutcome(key, seq, False, None, fenced=True, stored_fence=answer))
        elif isinstance(answer, BaseException):
            future.set_exception(answer)
        return future


@pytest.fixture
def redis_client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def _leases(client: fakeredis.FakeRedis, holder: str) -> DocumentLeases:
    client.set(alive_key(holder), 1, px=60_000)  # as its heartbeat would
    return DocumentLeases(client, holder=holder, ttl_s=900)


@pytest.fixture
def leases(redis_client: fakeredis.FakeRedis) -> DocumentLeases:
    return _leases(redis_client, "this-worker")


def _document(path: str, *, shard: int = 0, seq: int = 1) -> dict[str, Any]:
    event = WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash="sha256:" + "a" * 64, size=5, seq=seq)
    chunk = Chunk(ordinal=0, text="hello", start_char=0, end_char=5, start_line=1, end_line=1, token_count=1)
    return PreparedDocument(event=event, shard=shard, chunks=(chunk,), line_count=1).to_dict()


def test_documents_are_indexed_and_their_shards_named_for_the_bm25_update(leases: DocumentLeases) -> None:
    batcher = FakeBatcher({"old.txt": "stale"})
    raws = [_document("a.txt", shard=0), _document("b.txt", shard=1), _document("c.txt", shard=0),
            _document("old.txt", shard=1)]
    done = embed_message(raws, leases=leases, batcher=batcher, wait_s=5)
    assert (done.indexed, done.stale, done.failures) == (3, 1, ())
    # Every document the shard holds at this seq (or newer) has its shard's BM25 update scheduled: a
    # redelivered copy whose first run committed but lost its bookkeeping must schedule it again.
    assert done.committed == {0: (("z", "a.txt"), ("z", "c.txt")), 1: (("z", "b.txt"), ("z", "old.txt"))}
    # Every document reaches the batcher under its own lease's token, all of them before any is waited for.
    assert [path for path, _ in batcher.submitted] == ["a.txt", "b.txt", "c.txt", "old.txt"]
    assert all(fence is not None for _, fence in batcher.submitted)
    assert len({fence for _, fence in batcher.submitted}) == 4


def test_a_redelivered_copy_of_a_committed_message_schedules_the_bm25_update_again(
        leases: DocumentLeases) -> None:
    """The first run committed both documents and died before its BM25 bookkeeping: the copy finds them
    already applied, and still names their shards, so the update that was never scheduled is."""
    raws = [_document("a.txt", shard=0), _document("b.txt", shard=1)]
    done = embed_message(raws, leases=leases, batcher=FakeBatcher({"a.txt": "stale", "b.txt": "stale"}), wait_s=5)
    assert (done.indexed, done.stale, done.failures) == (0, 2, ())
    assert done.committed == {0: (("z", "a.txt"),), 1: (("z", "b.txt"),)}


def test_leases_are_given_back_whatever_became_of_the_document(redis_client: fakeredis.FakeRedis,
                                                               leases: DocumentLeases) -> None:
    batcher = FakeBatcher({"failed.txt": EmbeddingProviderError("503 from the provider"), "slow.txt": None})
    raws = [_document("ok.txt"), _document("failed.txt"), _document("slow.txt")]
    done = embed_message(raws, leases=leases, batcher=batcher, wait_s=0.05)
    assert done.indexed == 1
    other = _leases(redis_client, "other-worker")
    assert all(other.acquire("z", path) is not None for path in ("ok.txt", "failed.txt", "slow.txt"))


def test_each_document_fails_alone_with_its_own_error(redis_client: fakeredis.FakeRedis,
                                                     leases: DocumentLeases) -> None:
    assert _leases(redis_client, "other-worker").acquire("z", "held.txt") is not None
    provider_down = EmbeddingProviderError("503 from the provider")
    batcher = FakeBatcher({"failed.txt": provider_down, "slow.txt": None})
    malformed = {"event": {"zone": "z"}}
    raws = [_document("ok.txt"), malformed, _document("held.txt"), _document("failed.txt"), _document("slow.txt")]
    done = embed_message(raws, leases=leases, batcher=batcher, wait_s=0.05)
    assert done.indexed == 1
    errors = {raw["event"].get("path", "malformed"): error for raw, error in done.failures}
    assert set(errors) == {"malformed", "held.txt", "failed.txt", "slow.txt"}
    assert isinstance(errors["held.txt"], DocumentBusyError)
    assert errors["failed.txt"] is provider_down
    # A batch that does not commit in time is a transient failure the retry message takes over.
    assert isinstance(errors["slow.txt"], TransientError) and "within" in str(errors["slow.txt"])
    # Malformed and busy documents never reach the batcher.
    assert [path for path, _ in batcher.submitted] == ["ok.txt", "failed.txt", "slow.txt"]


def test_a_fenced_write_fails_and_the_next_lease_outranks_the_shards_token(leases: DocumentLeases) -> None:
    done = embed_message([_document("a.txt")], leases=leases, batcher=FakeBatcher({"a.txt": 5000}), wait_s=5)
    ((_, error),) = done.failures
    assert isinstance(error, LeaseLostError) and error.stored_fence == 5000
    assert done.indexed == 0 and done.committed == {}
    lease = leases.acquire("z", "a.txt")
    assert lease is not None and lease.token > 5000
