"""The query side's settings sections (``[query]`` and below), part of
:class:`shardfuse.pipeline.config.settings.Settings`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from shardfuse.pipeline.config.grep import GrepSettings
from shardfuse.pipeline.config.section import Section as _Section


class BoostSettings(_Section):
    """Ranking after fusion: multipliers for where and how the query matched (``enabled = false``: none)."""

    enabled: bool = True
    # Per field, the weight of a full match of the query's terms; partial matches scale toward 1.0.
    filename: float = Field(default=3.0, ge=1)
    title: float = Field(default=2.5, ge=1)
    path: float = Field(default=2.0, ge=1)
    tags: float = Field(default=2.0, ge=1)
    description: float = Field(default=1.5, ge=1)
    content: float = Field(default=1.0, ge=1)
    exact_phrase: float = Field(default=1.5, ge=1)  # the whole query appears verbatim
    prefix: float = Field(default=1.2, ge=1)  # the text starts with the query
    primary_symbol: float = Field(default=0.25, ge=0)  # added when the chunk's main symbol is in the query
    any_symbol: float = Field(default=0.15, ge=0)  # added when any symbol the chunk defines is
    complete_role: float = Field(default=0.10, ge=0)  # added for a chunk holding a whole definition
    declaration_role: float = Field(default=0.05, ge=0)  # added for a chunk holding a signature
    # A query that is one name ranks the chunks defining it first (query/symbol_boosts.py).
    definitions_first: bool = True


class RouterSettings(_Section):
    """Heuristic query routing: complexity picks the over-fetch multiplier and the legs' weights."""

    enabled: bool = True


class ExpansionSettings(_Section):
    """LLM query expansion through an OpenAI-compatible chat-completions API. Off by default."""

    enabled: bool = False
    base_url: str = "https://api.openai.com/v1"
    api_key: SecretStr = SecretStr("")
    model: str = "gpt-4o-mini"
    timeout_s: float = Field(default=2.0, gt=0)  # the whole expansion, retries included
    max_variants: int = Field(default=3, ge=0)
    cache_ttl_s: int = Field(default=86400, ge=0)
    # The Redis cache's bound: at most this many expansions (the oldest go first), none larger than this.
    cache_max_entries: int = Field(default=10_000, ge=0)
    cache_max_entry_bytes: int = Field(default=4096, ge=0)
    # Skip expansion when the keyword leg's top hit already scores this far above the next one.
    skip_min_top_score: float = Field(default=8.0, ge=0)
    skip_min_gap_ratio: float = Field(default=0.25, ge=0)


FusionName = Literal["rrf", "weighted", "rrf_weighted", "convex", "relative"]


class ZoneProfile(_Section):
    """A zone's own fusion defaults (``shardfuse eval --tune`` suggests one from judged queries)."""

    fusion: FusionName | None = None
    alpha: float | None = Field(default=None, ge=0, le=1)


class QuerySettings(_Section):
    over_fetch: int = Field(default=3, ge=1)
    # Each leg fetches at least this many candidates: fusion normalises scores over the legs' lists, so a
    # small k fetching few would rank differently from k = 10 (a function's definition fell from 1st to 3rd).
    min_leg_depth: int = Field(default=30, ge=1)
    rrf_k: int = Field(default=60, ge=1)
    max_k: int = Field(default=1000, ge=1)
    # The most candidates a request may ask one leg for (its keyword_depth / vector_depth): pgvector's
    # hnsw.ef_search, which a vector leg raises to its depth, stops at 1000.
    max_leg_depth: int = Field(default=1000, ge=1)
    # HNSW candidates a shard's vector search keeps (pgvector's hnsw.ef_search; never below the search's limit).
    # Recall@10 against exact search with the default model's vectors (tests/benchmarks/bench_vector_recall.py,
    # 100,000 texts in 4 shards, SciFact's and CoSQA's queries; session 20): 0.993 a shard and 0.9945 the merged
    # leg at 64, 0.9979 / 0.9987 at 160. Queries with no close neighbour in the corpus are the hard case: the
    # same queries over 80,000 texts without CoSQA's code snippets keep 0.894 / 0.909 at 64 and need 160 for
    # 0.95. 64 cut the hybrid query's p50 by ~21 % against 160 (bench_query, median of 3 runs). Raise it for a corpus
    # your queries often miss.
    hnsw_ef_search: int = Field(default=64, ge=1)
    # Shards sharing one database are read together (query/shard_batches.py): hydration in one statement, the
    # vector leg in this many, each on its own thread and server process (the server searches the shards of
    # one statement one after the other): about the server's cores. 0: one statement per shard.
    statements_per_database: int = Field(default=2, ge=0)
    # Diversification: at most this many chunks of one file in a result list (0 switches it off).
    max_chunks_per_file: int = Field(default=3, ge=0)
    # Results ranked below this carry a snippet instead of their chunk's full text.
    full_text_top_n: int = Field(default=8, ge=0)
    # Fused candidates hydrated and boosted per round: max(1.5 × k, rerank_depth); more rounds follow only
    # when deleted chunks or diversification leave fewer than k.
    rerank_depth: int = Field(default=50, ge=1)
    snippet_chars: int = Field(default=240, ge=20)
    # Defaults for requests that do not name them (a zone's profile below comes first). Relative at 0.6 beat
    # the earlier default, convex at 0.5, on both tuning splits (SciFact train 0.7394 vs 0.7317, CoSQA dev
    # 0.5579 vs 0.5525; router, boosts and grep leg on; issue 22); `shardfuse eval --tune` measures a zone's own best.
    fusion: FusionName = "relative"
    alpha: float = Field(default=0.6, ge=0, le=1)
    # Per zone, fusion defaults that override the two above: [query.zone_profiles."my-zone"] fusion = …
    zone_profiles: dict[str, ZoneProfile] = Field(default_factory=dict)

    def fusion_defaults(self, zone: object) -> tuple[str, float]:
        """The fusion and alpha a request to ``zone`` gets when it names neither."""
        profile = self.zone_profiles.get(zone) if isinstance(zone, str) else None
        fusion = profile.fusion if profile is not None and profile.fusion is not None else self.fusion
        alpha = profile.alpha if profile is not None and profile.alpha is not None else self.alpha
        return fusion, alpha
    # Whole answers cached in Redis for this long (0: off); any write or rebuild changes the key.
    result_cache_ttl_s: int = Field(default=300, ge=0)
    # ... and at most this many of them (the oldest go first), an answer larger than this not at all: the
    # cache shares the broker's Redis (docs/operations.md, "Memory budget").
    result_cache_max_entries: int = Field(default=2_000, ge=0)
    result_cache_max_entry_bytes: int = Field(default=64 * 1024, ge=0)
    rpc_timeout_s: float = 30.0
    # A search not answered within this long is sent once more, and the first answer of either copy is
    # returned (within rpc_timeout_s in all): the query worker holding it may have died, and the broker
    # gives a dead worker's messages back only after 2 × delivery.dead_after_s. 0: never sent again.
    rpc_retry_after_s: float = Field(default=10.0, ge=0)
    boosts: BoostSettings = BoostSettings()
    router: RouterSettings = RouterSettings()
    expansion: ExpansionSettings = ExpansionSettings()
    grep: GrepSettings = GrepSettings()
