"""Grep over shards (in-memory shards that answer the GIN lookup as PostgreSQL does): every matching line and
nothing else, in (path, line) order, at most k with ``truncated``, zones kept apart, and clear refusals."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import pytest

from shardfuse.pipeline.config.grep import GrepSettings
from shardfuse.pipeline.core.documents import Chunk
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.index.store import ChunkFilter
from shardfuse.pipeline.index.store.grep_blocks import block_rows, cut_blocks
from shardfuse.pipeline.index.store.grep_store import CandidateBlock
from shardfuse.query.grep.pattern import GrepPattern
from shardfuse.query.grep.search import GrepFound, clip, grep_all


class MemoryGrepShard:
    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.rows: list[tuple[object, ...]] = []
        self.calls = 0
        self.counts = 0

    def add(self, zone: str, path: str, text: str, *, seq: int = 1, max_lines: int = 4) -> None:
        lines = text.count("\n") + 1
        chunks = (Chunk(0, text, 0, len(text), 1, lines, 1),)
        self.rows += block_rows(zone=zone, path=path, seq=seq, blocks=cut_blocks(text, max_lines=max_lines),
                                chunks=chunks)

    def grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                    after: tuple[str, int] | None = None, limit: int) -> list[CandidateBlock]:
        self.calls += 1
        return [CandidateBlock(path=r[1], block=r[2], seq=r[3], start_line=r[4], text=r[5],  # type: ignore[arg-type]
                               chunk_lines=tuple(r[6])) for r in self._matching(zone, any_of, where, after)[:limit]]  # type: ignore[call-overload]

    def _matching(self, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None,
                  after: tuple[str, int] | None) -> list[tuple[object, ...]]:
        return sorted(
            (r for r in self.rows if r[0] == zone and any(set(c) <= set(r[7]) for c in any_of)  # type: ignore[call-overload]
             and (not where or not where.path_prefix or str(r[1]).startswith(where.path_prefix))
             and (after is None or (r[1], r[2]) > after)),
            key=lambda r: (r[1], r[2]))  # type: ignore[arg-type,return-value]

    def count_grep_blocks(self, *, zone: str, any_of: Sequence[Sequence[int]], where: ChunkFilter | None = None,
                          cap: int) -> int:
        self.counts += 1
        return min(cap, len(self._matching(zone, any_of, where, None)))


def _now(work: Callable[[], GrepFound]) -> Future[GrepFound]:
    future: Future[GrepFound] = Future()
    future.set_result(work())
    return future


def _grep(shards: list[MemoryGrepShard], text: str, *, zones: Sequence[str] = ("z",), k: int = 1000,
          regex: bool = False, case_sensitive: bool = True, where: ChunkFilter | None = None,
          settings: GrepSettings | None = None) -> GrepFound:
    pattern = GrepPattern(text, regex=regex, case_sensitive=case_sensitive)
    return grep_all(shards, _now, pattern, zones=zones, where=where, max_lines=k,  # type: ignore[arg-type]
                    settings=settings or GrepSettings())  # type: ignore[arg-type]


WORDS = ["apply_async", "self.app", "Celery", "celery", "send_task", "(x)", "result", "def", "return", "é"]


def _corpus(seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"pkg/m{i:02}.py": "\n".join(" ".join(rng.choices(WORDS, k=rng.randint(0, 6))) for _ in range(40))
            for i in range(20)}


@pytest.mark.parametrize(("needle", "regex", "case_sensitive"), [
    ("apply_async", False, True), ("celery", False, False), ("celery", False, True), ("(x) re", False, True),
    (r"def\s+[a-z_]+ \(x\)", True, True), (r"^celery", True, False), (r"send_task|self\.app$", True, True),
])
def test_every_matching_line_and_nothing_else(needle: str, regex: bool, case_sensitive: bool) -> None:
    shards = [MemoryGrepShard(0), MemoryGrepShard(1)]
    corpus = _corpus(7)
    for i, (path, text) in enumerate(sorted(corpus.items())):
        shards[i % 2].add("z", path, text)
    expected = re.compile(needle if regex else re.escape(needle), 0 if case_sensitive else re.IGNORECASE)
    want = [(path, n, line) for path, text in sorted(corpus.items())
            for n, line in enumerate(text.split("\n"), start=1) if expected.search(line)]
    found = _grep(shards, needle, regex=regex, case_sensitive=case_sensitive)
    assert [(h.path, h.line, h.text) for h in found.hits] == want
    assert not found.truncated and want


def test_at_most_k_lines_in_path_order_and_truncated_says_there_are_more() -> None:
    shards = [MemoryGrepShard(0), MemoryGrepShard(1)]
    for i in range(10):
        shards[i % 2].add("z", f"f{i}.py", "\n".join(["hit_me here"] * 30), max_lines=3)
    found = _grep(shards, "hit_me", k=25, settings=GrepSettings(page_blocks=2))
    assert [(h.path, h.line) for h in found.hits] == [("f0.py", n) for n in range(1, 26)]
    assert found.truncated
    assert not _grep(shards, "hit_me", k=300).truncated


def test_a_shard_stops_at_max_blocks_and_says_truncated() -> None:
    shard = MemoryGrepShard(0)
    shard.add("z", "a.py", "\n".join(f"needle_x {i}" for i in range(100)), max_lines=1)
    found = _grep([shard], "needle_x", settings=GrepSettings(page_blocks=8, max_blocks=20))
    assert len(found.hits) == 20 and found.truncated and found.blocks == 20


def test_zones_never_cross_and_each_line_names_its_zone_and_chunk() -> None:
    shard = MemoryGrepShard(0)
    shard.add("mine", "a.py", "secret_token = 1")
    shard.add("theirs", "a.py", "secret_token = 2")
    found = _grep([shard], "secret_token", zones=("mine",))
    assert [(h.zone, h.text) for h in found.hits] == [("mine", "secret_token = 1")]
    assert found.hits[0].chunk_id is not None
    both = _grep([shard], "secret_token", zones=("theirs", "mine"))
    assert [h.zone for h in both.hits] == ["theirs", "mine"]


def test_path_prefix_narrows_and_unlocks_patterns_without_grams() -> None:
    shard = MemoryGrepShard(0)
    shard.add("z", "src/a.py", "x = 1\ny = 2")
    shard.add("z", "docs/b.md", "x = 3")
    with pytest.raises(InvalidQueryError, match="path_prefix or filters"):
        _grep([shard], "=")
    found = _grep([shard], "=", where=ChunkFilter(path_prefix="src/"))
    assert [(h.path, h.line) for h in found.hits] == [("src/a.py", 1), ("src/a.py", 2)]


def test_bad_patterns_are_refused_clearly() -> None:
    with pytest.raises(InvalidQueryError, match="RE2"):
        GrepPattern(r"(a)\1", regex=True, case_sensitive=True)
    with pytest.raises(InvalidQueryError, match="RE2"):
        GrepPattern("(?<=a)b", regex=True, case_sensitive=True)
    with pytest.raises(InvalidQueryError, match="line break"):
        GrepPattern("a\nb", regex=False, case_sensitive=True)
    with pytest.raises(InvalidQueryError, match="RE2"):
        GrepPattern("[a-z]{1000}{1000}", regex=True, case_sensitive=True)


def test_a_long_line_is_clipped_around_its_match() -> None:
    line = "a" * 1000 + "NEEDLE" + "b" * 1000
    clipped = clip(line, 1000, 100)
    assert "NEEDLE" in clipped and len(clipped) <= 100 and clipped.startswith("…") and clipped.endswith("…")
    assert clip("short\r", 0, 100) == "short"
