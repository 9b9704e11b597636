"""Shard maintenance steps (shardfuse.pipeline.index.maintenance): what a BM25 update or a deferred HNSW build
does, and what it says must follow."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from shardfuse.pipeline.index.maintenance import (
    LoadState,
    VectorIndexResult,
    build_deferred_vector_index,
    build_deferred_vector_indexes,
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

    def build_vector_index(self, *, parallel_workers: int | None = None) -> float | None:
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

    def build(*, parallel_workers: int | None = None) -> float | None:
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


class ShardStoreFake(FakeStore):
    """A shard's store whose build waits until ``together`` builds are running at once (or times out)."""

    def __init__(self, shard: int, *, deferred: bool, together: threading.Barrier | None = None) -> None:
        super().__init__(deferred=deferred)
        self.shard = shard
        self.together = together
        self.workers: list[int | None] = []

    def build_vector_index(self, *, parallel_workers: int | None = None) -> float | None:
        self.workers.append(parallel_workers)
        if self.together is not None:
            self.together.wait(timeout=10)  # BrokenBarrierError if the builds ran one after the other
        return super().build_vector_index()


def test_the_deferred_shards_build_side_by_side_each_with_the_workers_the_cores_leave_it() -> None:
    together = threading.Barrier(2)
    stores = [ShardStoreFake(0, deferred=True, together=together), ShardStoreFake(1, deferred=False),
              ShardStoreFake(2, deferred=True, together=together)]
    cleared: list[int] = []
    steps = build_deferred_vector_indexes(stores, pending_documents=lambda: 0, clear_schedule=cleared.append, cores=4)
    assert {n: s.result for n, s in steps.items()} == {0: VectorIndexResult.BUILT, 1: VectorIndexResult.PRESENT,
                                                       2: VectorIndexResult.BUILT}
    assert stores[0].workers == stores[2].workers == [1] and stores[1].builds == 0  # 4 cores over 2 builds
    assert cleared == [0, 1, 2]


def test_a_single_deferred_shard_builds_with_the_configured_workers_and_a_load_still_waits() -> None:
    store = ShardStoreFake(0, deferred=True)
    ignore: list[int] = []
    waiting = build_deferred_vector_indexes([store], pending_documents=lambda: 5, clear_schedule=ignore.append, cores=2)
    assert waiting[0].result is VectorIndexResult.WAITING and store.builds == 0
    built = build_deferred_vector_indexes([store], pending_documents=lambda: 0, clear_schedule=ignore.append, cores=2)
    assert built[0].result is VectorIndexResult.BUILT and store.workers == [None]


class FakePacing:
    """The last delta update per shard, as Bm25Freshness keeps it in Redis."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[float, float]] = {}

    def record_update(self, shard: int, *, seconds: float, at: float) -> None:
        self.last[shard] = (at, seconds)

    def update_wait(self, shard: int, *, factor: float, now: float) -> float:
        at, seconds = self.last.get(shard, (0.0, 0.0))
        return max(0.0, at + factor * seconds - now)


class TimedIndexer(FakeIndexer):
    """A delta that takes ``seconds`` on the fake clock."""

    def __init__(self, clock: list[float], *, seconds: float, merge_due: bool = False) -> None:
        super().__init__(merge_due=merge_due)
        self.clock = clock
        self.seconds = seconds

    def update(self) -> dict[str, Any]:
        self.clock[0] += self.seconds
        return super().update()


def _load(*, loading: bool, deferred: bool) -> LoadState:
    return LoadState(loading=lambda: loading, deferred=lambda: deferred)


def test_during_a_load_deltas_are_spaced_by_a_multiple_of_the_last_ones_duration() -> None:
    clock, pacing, claims = [100.0], FakePacing(), FakeClaims()
    indexer = TimedIndexer(clock, seconds=2.0)

    def update(loading: bool) -> Any:
        return update_bm25(indexer, claims=claims, merge=False, rebuild_debounce_s=1,
                           load=_load(loading=loading, deferred=True), pacing=pacing, clock=lambda: clock[0])

    assert update(True).result["kind"] == "delta" and pacing.last[3] == (102.0, 2.0)
    clock[0] = 104.0
    paced = update(True)  # 2 s after a 2 s delta: it waits until 3 × 2 s have passed
    assert paced.result["kind"] == "paced" and paced.update_in_s == pytest.approx(4.0)
    assert indexer.calls == ["update"]
    clock[0] = 108.0
    assert update(True).result["kind"] == "delta"
    assert update(False).result["kind"] == "delta"  # the queues are empty: the last commits are indexed at once
    assert indexer.calls == ["update"] * 3


def test_no_merge_is_claimed_during_a_bulk_load_and_the_first_update_after_it_claims_it() -> None:
    clock, claims = [0.0], FakeClaims()
    indexer = TimedIndexer(clock, seconds=0.5, merge_due=True)
    during = update_bm25(indexer, claims=claims, merge=False, rebuild_debounce_s=1,
                         load=_load(loading=True, deferred=True), pacing=FakePacing(), clock=lambda: clock[0])
    assert during.merge_in_s is None and claims.claimed == set()
    after = update_bm25(indexer, claims=claims, merge=False, rebuild_debounce_s=1,
                        load=_load(loading=False, deferred=True), pacing=FakePacing(), clock=lambda: clock[0])
    assert after.merge_in_s == 1 and claims.claimed == {3}


def test_a_merge_waits_for_the_indexes_a_bulk_load_deferred_keeping_its_claim() -> None:
    claims = FakeClaims()
    claims.claim_merge(3)
    indexer = FakeIndexer()
    waiting = update_bm25(indexer, claims=claims, merge=True, rebuild_debounce_s=2,
                          load=_load(loading=False, deferred=True))
    assert waiting.merge_in_s == 2 and indexer.calls == [] and claims.claimed == {3}
    done = update_bm25(indexer, claims=claims, merge=True, rebuild_debounce_s=2,
                       load=_load(loading=False, deferred=False))
    assert done.result["kind"] == "merge" and claims.claimed == set()
