"""A generation plus a delta ranks as a full build does: SciFact keyword nDCG@10 within ±0.005."""

from __future__ import annotations

from pathlib import Path

import fakeredis
import pytest

from shardfuse.pipeline.index.lexical import LexicalShardReader, read_manifest
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.stats import combine
from shardfuse.query.evaluation import load_beir, ndcg_at_k
from tests.support.paths import SHARED_DATA
from tests.unit.pipeline.index.lexical_fakes import MemoryShard, indexer

DATA = SHARED_DATA / "scifact"
ZONE = "scifact"


def _ndcg(reader: LexicalShardReader, queries: dict[str, str], qrels: dict[str, dict[str, int]], *,
          zone_stats: bool) -> float:
    total = 0.0
    for qid, text in queries.items():
        stats = combine([reader.term_stats(text, zone=ZONE)]) if zone_stats else None
        hits = reader.search(text, zone=ZONE, k=10, stats=stats)
        total += ndcg_at_k([h.chunk_id.split("#")[0] for h in hits], qrels.get(qid, {}), 10)
    return total / len(queries)


@pytest.mark.parametrize("delta_share", [0.20])
def test_base_plus_delta_matches_a_full_build(tmp_path: Path, delta_share: float) -> None:
    if not DATA.is_dir():
        pytest.skip(f"SciFact is not under {DATA}")
    data = load_beir(DATA, split="test")
    docs = [(d.doc_id, f"{d.title}\n\n{d.text}") for d in data.corpus]
    cut = int(len(docs) * (1 - delta_share))

    full_shard = MemoryShard()
    for doc_id, text in docs:
        full_shard.write(ZONE, doc_id, text)
    indexer(tmp_path / "full", full_shard).merge()

    shard = MemoryShard()
    for doc_id, text in docs[:cut]:
        shard.write(ZONE, doc_id, text)
    freshness = Bm25Freshness(fakeredis.FakeRedis())
    job = indexer(tmp_path / "delta", shard, freshness, delta_max_chunks=len(docs))
    job.merge()
    # The last documents arrive after the base was built, and every 20th base document is rewritten
    # (same text, new chunk ids): its base rows are masked and the delta holds it again.
    written = [doc_id for doc_id, _ in docs[cut:]] + [doc_id for doc_id, _ in docs[:cut:20]]
    for doc_id, text in docs[cut:] + docs[:cut:20]:
        shard.write(ZONE, doc_id, text)
    freshness.mark_dirty(0, [(ZONE, d) for d in written])
    assert job.update()["kind"] == "delta"
    manifest = read_manifest(tmp_path / "delta", 0)
    assert manifest is not None and manifest.delta_docs == len(written) and manifest.delta_masked == len(docs[:cut:20])

    full = LexicalShardReader(tmp_path / "full", 0)
    incremental = LexicalShardReader(tmp_path / "delta", 0)
    for zone_stats in (True, False):
        want = _ndcg(full, data.queries, data.qrels, zone_stats=zone_stats)
        got = _ndcg(incremental, data.queries, data.qrels, zone_stats=zone_stats)
        print(f"delta {delta_share:.0%} zone_stats={zone_stats}: full {want:.4f}, base+delta {got:.4f}")
        assert abs(got - want) <= 0.005
