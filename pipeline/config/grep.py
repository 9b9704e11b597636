"""The grep mode's settings (``[query.grep]``), part of :class:`shardfuse.pipeline.config.query.QuerySettings`."""

from __future__ import annotations

from pydantic import Field

from shardfuse.pipeline.config.section import Section as _Section


class GrepSettings(_Section):
    """Literal and regex search over the trigram index (``mode = "grep"``), and the grep leg of hybrid search."""

    # Candidate blocks read per round trip to a shard (later rounds read four times as many, up to 1024).
    page_blocks: int = Field(default=64, ge=1)
    # Blocks verified per shard and query at most: past it the answer says ``truncated`` (a pattern whose
    # grams are in most blocks, or one with no gram under a broad path prefix).
    max_blocks: int = Field(default=20_000, ge=1)
    # A returned line longer than this is clipped around its match.
    line_chars: int = Field(default=240, ge=20)
    # Hybrid queries that look like code (identifier-like tokens, query/router.py) add a third leg: the
    # case-sensitive literal grep of up to ``leg_tokens`` of those tokens, chunks ranked by how many tokens
    # and lines they hold. A token found on more than ``leg_max_lines`` lines is no exact-match evidence:
    # it adds nothing.
    hybrid_leg: bool = True
    leg_tokens: int = Field(default=3, ge=1)
    leg_max_lines: int = Field(default=200, ge=1)
    # ... and one whose trigrams are so common that more than this many candidate blocks of a shard would have
    # to be verified to find its lines (a short token such as "IgA": every block holding "iga") adds nothing
    # either. The leg counts a token's candidate blocks first (no text read) and reads them only under this
    # cap. 1024 → 256 (issue 23): the tokens between the two were found on more than leg_max_lines lines
    # anyway, after reading hundreds of blocks; at 100,000 chunks the hybrid p99 fell from ~40 to ~21 ms with
    # 1,000 of 1,000 top-10 lists unchanged (tests/benchmarks/bench_query.py's queries).
    leg_max_blocks: int = Field(default=256, ge=1)
    # The grep leg's fusion weight, next to the router's keyword and vector weights (about 1 each).
    leg_weight: float = Field(default=1.0, ge=0)
