"""The grep mode as a request and an answer, and the grep leg of hybrid search."""

from __future__ import annotations

import pytest

from shardfuse.pipeline.config.grep import GrepSettings
from shardfuse.pipeline.config.query import QuerySettings
from shardfuse.pipeline.core.documents import chunk_id
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.index.store import ChunkFilter
from shardfuse.query.grep.service import GrepService
from shardfuse.query.request import Mode, parse_request
from shardfuse.workers.cli.querying import format_results
from tests.unit.query.grep.test_grep_search import MemoryGrepShard, _now


def _service(settings: GrepSettings | None = None) -> tuple[GrepService, MemoryGrepShard]:
    shard = MemoryGrepShard(0)
    shard.add("z", "a.py", "def send_task(name):\n    return apply_async(name)\n")
    shard.add("z", "b.py", "# send_task is documented elsewhere\n")
    for i in range(5):
        shard.add("z", f"noise{i}.py", "\n".join(["value = compute()"] * 10))
    return GrepService(shards=[shard], submit=_now, settings=settings or GrepSettings()), shard  # type: ignore[arg-type]


def test_a_grep_request_answers_lines_and_refuses_grep_options_elsewhere() -> None:
    settings = QuerySettings()
    request = parse_request({"query": "send_task(", "zone": "z", "mode": "grep"}, settings=settings)
    assert request.mode is Mode.GREP and not request.mode.uses_keyword and not request.mode.uses_vector
    service, _ = _service()
    answer = service.answer(request)
    assert [(r["path"], r["line"], r["text"]) for r in answer["results"]] == [("a.py", 1, "def send_task(name):")]
    assert answer["case_sensitive"] is True and answer["truncated"] is False
    assert format_results(answer).splitlines()[1] == "a.py:1: def send_task(name):"
    ignoring = parse_request({"query": "SEND_TASK", "zone": "z", "mode": "grep", "case_sensitive": False},
                             settings=settings)
    assert [r["path"] for r in service.answer(ignoring)["results"]] == ["a.py", "b.py"]
    with pytest.raises(InvalidQueryError, match="regex applies to mode 'grep' only"):
        parse_request({"query": "x", "zone": "z", "regex": True}, settings=settings)
    with pytest.raises(InvalidQueryError, match="case_sensitive applies to mode 'grep' only"):
        parse_request({"query": "x", "zone": "z", "mode": "keyword", "case_sensitive": False}, settings=settings)


def test_the_grep_leg_ranks_chunks_by_tokens_held_and_skips_unselective_tokens() -> None:
    service, _ = _service(GrepSettings(leg_max_lines=20))
    leg = service.leg(["apply_async", "send_task", "compute"], zones=["z"], where=ChunkFilter(), limit=10)
    assert leg is not None
    # a.py holds both tokens; b.py one; "compute" is on 50 lines (> leg_max_lines): no evidence, left out.
    assert [hit.chunk_id for _, hit in leg.hits] == [chunk_id("z", "a.py", 1, 0), chunk_id("z", "b.py", 1, 0)]
    assert leg.hits[0][1].score > leg.hits[1][1].score and set(leg.zones.values()) == {"z"}
    assert service.leg(["compute"], zones=["z"], where=ChunkFilter(), limit=10) is None
    hybrid = parse_request({"query": "where is send_task called", "zone": "z", "mode": "hybrid"},
                           settings=QuerySettings())
    timings: dict[str, float] = {}
    assert list(service.legs(hybrid, 10, timings=timings)) == ["grep"] and "grep" in timings
    prose = parse_request({"query": "where are tasks sent", "zone": "z"}, settings=QuerySettings())
    assert service.legs(prose, 10, timings={}) == {}


def test_the_grep_leg_is_never_complete_so_its_misses_count_as_its_weakest_hit() -> None:
    # Fusion scores a chunk a complete leg missed as 0. The grep leg's exact tokens are weak evidence in prose
    # (gene names, acronyms): a chunk without them must not sink, even when the leg found every match.
    service, _ = _service(GrepSettings(leg_max_lines=20))
    leg = service.leg(["send_task"], zones=["z"], where=ChunkFilter(), limit=10)
    assert leg is not None and len(leg.hits) == 2 and not leg.complete


def test_the_grep_leg_drops_a_token_with_more_candidate_blocks_than_it_verifies_but_grep_mode_does_not() -> None:
    service, _ = _service(GrepSettings(leg_max_lines=1000, leg_max_blocks=3))
    # "compute" is in 5 blocks, past the leg's 3: no evidence; "send_task" (2 blocks) still counts.
    assert service.leg(["compute"], zones=["z"], where=ChunkFilter(), limit=10) is None
    leg = service.leg(["send_task", "compute"], zones=["z"], where=ChunkFilter(), limit=10)
    assert leg is not None and [hit.chunk_id for _, hit in leg.hits] == [chunk_id("z", "a.py", 1, 0),
                                                                         chunk_id("z", "b.py", 1, 0)]
    request = parse_request({"query": "compute", "zone": "z", "mode": "grep", "k": 100}, settings=QuerySettings())
    answer = service.answer(request)
    assert len(answer["results"]) == 50 and answer["truncated"] is False


def test_the_grep_leg_counts_a_common_tokens_candidates_instead_of_reading_them() -> None:
    service, shard = _service(GrepSettings(leg_max_lines=1000, leg_max_blocks=3, page_blocks=1))
    # "compute" has 5 candidate blocks, past 3: counted, dropped, no block read.
    assert service.leg(["compute"], zones=["z"], where=ChunkFilter(), limit=10) is None
    assert (shard.calls, shard.counts) == (0, 1)
    # A token under the cap is read to the end, as before: send_task's 2 blocks take a count and 2 pages.
    shard.calls = shard.counts = 0
    leg = service.leg(["send_task"], zones=["z"], where=ChunkFilter(), limit=10)
    assert leg is not None and len(leg.hits) == 2 and (shard.calls, shard.counts) == (2, 1)
    # grep mode never counts: it pages through every candidate block.
    shard.calls = shard.counts = 0
    answer = service.answer(parse_request({"query": "compute", "zone": "z", "mode": "grep", "k": 100},
                                          settings=QuerySettings()))
    assert len(answer["results"]) == 50 and shard.counts == 0 and shard.calls > 1
