"""Shard maintenance steps (shardfuse.pipeline.index.maintenance): what a BM25 update or a deferred HNSW build
does, and what it says must follow."""

from __future__ import annotations

from typing import Any

import pytest

from shardfuse.pipeline.index.maintenance import (
    VectorIndexResult,
    build_deferred_vector_index,
    update_bm25,
)


class FakeIndexer:
    def __init__(self, *, merge_due: bool = False, fail_merge: bool = False) -> None:
        self.shard = 3
        self.calls: list[str] = []
        self.merge_due = merge_due
        self.fail_merge = fail_merge

    def update(self) -> dict[str, Any]:
        self.calls.append("update")
        return {"shard": self.shard, "kind": "delta", "merge_due": self.merge_due}

    def merge(self) -> dict[str, Any]:
        self.calls.append("merge")
        if self.fail_merge:
            raise OSError("disk full")
        return {"shard": self.shard, "kind": "merge", "merge_due": False}


class FakeClaims:
    """One merge claim per shard, as Bm25Freshness keeps in Redis; the last build took ``last_build_s``."""

    def __init__(self, last_build_s: float = 0.0) -> None:
        self.claimed: set[int] = set()
        self.last_build_s = last_build_s

    def claim_merge(self, shard: int) -> bool:
        if shard in self.claimed:
            return False
        self.claimed.add(shard)
        return True

    def release_merge(self, shard: int) -> None:
        self.claimed.discard(shard)

    def rebuild_delay(self, shard: int, *, debounce_s: float) -> float:
        return max(debounce_s, 2 * self.last_build_s)


def test_a_delta_with_no_merge_due_schedules_nothing() -> None:
    claims = FakeClaims()
    update = update_bm25(FakeIndexer(), claims=claims, merge=False, rebuild_debounce_s=5)
    assert update.result["kind"] == "delta" and update.merge_in_s is None
    assert claims.claimed == set()


def test_a_merge_due_is_scheduled_once_paced_by_the_last_build() -> None:
    claims = FakeClaims(last_build_s=40)
    first = update_bm25(FakeIndexer(merge_due=True), claims=claims, merge=False, rebuild_debounce_s=5)
    assert first.merge_in_s == 80  # twice the last build, which is longer than the debounce
    # Another update of the shard while the merge is pending does not schedule a second one.
    second = update_bm25(FakeIndexer(merge_due=True), claims=claims, merge=False, rebuild_debounce_s=5)
    assert second.merge_in_s is None


@pytest.mark.parametrize("fail", [False, True], ids=["merged", "merge-failed"])
def test_a_merge_gives_the_claim_back_whatever_happens(fail: bool) -> None:
    claims = FakeClaims()
    claims.claim_merge(3)
    indexer = FakeIndexer(fail_merge=fail)
    if fail:
        with pytest.raises(OSError, match="disk full"):
            update_bm25(indexer, claims=claims, merge=True, rebuild_debounce_s=5)
    else:
        assert update_bm25(indexer, claims=claims, merge=True, rebuild_debounce_s=5).result["kind"] == "merge"
    assert indexer.calls == ["merge"]
    assert claims.claim_merge(3)  # the next merge due can be scheduled


class FakeStore:
    def __init__(self, *, deferred: bool, seconds: float | None = 1.5) -> None:
        self.deferred = deferred
        self.seconds = seconds
        self.builds = 0

    def vector_index_deferred(self) -> bool:
        return self.deferred

    def build_vector_index(self) -> float | None:
        self.builds += 1
        self.deferred = False
        return self.seconds


def test_the_build_waits_while_documents_wait_in_the_queues() -> None:
    store, cleared = FakeStore(deferred=True), []
    step = build_deferred_vector_index(store, pending_documents=lambda: 12, clear_schedule=lambda: cleared.append(1))
    assert step.result is VectorIndexResult.WAITING
    assert step.as_dict(2) == {"shard": 2, "result": "waiting", "pending_documents": 12}
    assert store.builds == 0 and cleared == []  # still scheduled: no second build is scheduled meanwhile


def test_once_the_load_is_over_the_deferred_index_is_built_after_clearing_the_schedule() -> None:
    events: list[str] = []
    store = FakeStore(deferred=True)
    original = store.build_vector_index

    def build() -> float | None:
        events.append("build")
        return original()

    store.build_vector_index = build  # type: ignore[method-assign]
    step = build_deferred_vector_index(store, pending_documents=lambda: 0,
                                       clear_schedule=lambda: events.append("clear"))
    # Cleared first, so a write landing during the build schedules another one.
    assert events == ["clear", "build"]
    assert step.as_dict(2) == {"shard": 2, "result": "built", "seconds": 1.5}


@pytest.mark.parametrize(
    ("store", "expected"),
    [(FakeStore(deferred=False), {"shard": 0, "result": "present"}),
     (FakeStore(deferred=True, seconds=None), {"shard": 0, "result": "building elsewhere", "seconds": None})],
    ids=["present", "elsewhere"],
)
def test_an_index_present_or_being_built_elsewhere_is_not_built_again(store: FakeStore,
                                                                      expected: dict[str, Any]) -> None:
    step = build_deferred_vector_index(store, pending_documents=lambda: 0, clear_schedule=lambda: None)
    assert step.as_dict(0) == expected
    assert store.builds == (1 if store.seconds is None else 0)
