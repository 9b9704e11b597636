"""``shardfuse eval``: index a BEIR dataset through the real pipeline and score every search mode."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.query.evaluation import BeirDataset, load_beir, mrr_at_k, ndcg_at_k, percentile, recall_at_k
from shardfuse.query.fusion import Fusion
from shardfuse.query.request import Mode
from shardfuse.workers.cli import arguments
from shardfuse.workers.cli.eval_indexing import index_documents
from shardfuse.workers.cli.querying import add_stage_switches, search_options
from shardfuse.workers.client import SearchClient

RETRIEVE_K = 100  # deep enough for Recall@100


def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="index a BEIR-layout dataset and report nDCG@10, Recall@100, MRR@10, latency")
    p.add_argument("dataset", type=Path, metavar="DATASET_DIR")
    p.add_argument("--split", default="test")
    p.add_argument("--modes", default="keyword,semantic,hybrid", help="comma-separated search modes")
    p.add_argument("--fusion", choices=[f.value for f in Fusion], help="hybrid fusion (default: query.fusion)")
    p.add_argument("--alpha", type=float, help="vector leg weight for weighted fusions (default: query.alpha)")
    add_stage_switches(p)
    p.add_argument("--shards", type=arguments.positive_int, help="check that the running stack has this many shards")
    p.add_argument("--zone", type=arguments.zone, help="zone to index into (default: eval-<dataset name>)")
    p.add_argument("--republish", action="store_true", help="publish the corpus even if the zone holds it")
    p.add_argument("--max-queries", type=arguments.positive_int, help="score only the first N judged queries")
    p.add_argument("--timeout", type=arguments.positive_float, default=3600.0, help="seconds to wait for indexing")
    p.add_argument("--latency-k", type=int, default=10, metavar="K",
                   help="after scoring at k=100, ask every query again at this k, as a user would, and report "
                        "its latency and its nDCG@10 / MRR@10 (default 10; 0 skips the pass)")
    p.add_argument("--tune", action="store_true",
                   help="score hybrid fusions (rrf; convex and relative at α 0.3–0.8) on this split and print the best "
                        "as a zone profile for the config file; tune on a dev/train split, report on test")
    p.add_argument("--json", action="store_true", help="also print one JSON object, keyed by mode, last")
    p.set_defaults(handler=run_eval)


def run_eval(args: argparse.Namespace, settings: Settings) -> int:
    modes = [Mode(m.strip()) for m in args.modes.split(",") if m.strip()]
    if args.shards is not None and args.shards != settings.shards:
        raise ConfigurationError(
            f"the stack is configured with {settings.shards} shard(s), not {args.shards}: start a stack with "
            f"SHARDFUSE_SHARDS={args.shards} (and its own --data-dir and ports) to evaluate that layout"
        )
    data = load_beir(args.dataset, split=args.split)
    zone = args.zone or "eval-" + re.sub(r"[^A-Za-z0-9_.\-]", "-", data.name)
    _index(data, zone=zone, settings=settings, republish=args.republish, timeout=args.timeout)

    query_ids = sorted(data.queries)[: args.max_queries] if args.max_queries else sorted(data.queries)
    client = SearchClient(settings)
    if args.tune:
        return _tune(data, query_ids, zone=zone, client=client, args=args, shards=settings.shards)
    # Scored and timed for real: the result cache would answer repeated runs without searching.
    options = {**search_options(args), "cache": False}
    report = {}
    for mode in modes:
        report[mode.value] = _score(data, query_ids, mode=mode, zone=zone, client=client, options=options)
        if args.latency_k:
            report[mode.value].update(_at_k(data, query_ids, mode=mode, zone=zone, client=client, options=options,
                                            k=args.latency_k))
    print(_table(report, dataset=data.name, queries=len(query_ids), shards=settings.shards))
    if args.json:
        print(json.dumps(report))
    return 0


# What --tune tries: RRF, then the convex and relative combinations at several vector weights.
TUNE_CANDIDATES: tuple[tuple[str, float], ...] = (
    ("rrf", 0.5), *((fusion, alpha / 10) for fusion in ("convex", "relative") for alpha in range(3, 9))
)


def _tune(data: BeirDataset, query_ids: list[str], *, zone: str, client: SearchClient,
          args: argparse.Namespace, shards: int) -> int:
    report: dict[str, dict[str, Any]] = {}
    for fusion, alpha in TUNE_CANDIDATES:
        options = {**search_options(args), "fusion": fusion, "alpha": alpha, "cache": False}
        label = fusion if fusion == "rrf" else f"{fusion}:{alpha:.1f}"
        report[label] = _score(data, query_ids, mode=Mode.HYBRID, zone=zone, client=client, options=options)
    best = max(report, key=lambda label: report[label]["ndcg@10"])
    print(_table(report, dataset=f"{data.name} ({args.split}), hybrid fusions", queries=len(query_ids),
                 shards=shards, first_column="fusion"))
    best_fusion, _, best_alpha = best.partition(":")
    print(f"\nbest: {best} (nDCG@10 {report[best]['ndcg@10']}). For the config file:\n")
    profile = f'[query.zone_profiles."{zone}"]\nfusion = "{best_fusion}"'
    print(profile + (f"\nalpha = {best_alpha}" if best_alpha else ""))
    if args.json:
        print(json.dumps({"best": best, "fusions": report}))
    return 0


def _index(data: BeirDataset, *, zone: str, settings: Settings, republish: bool, timeout: float) -> None:
    documents = [(doc.doc_id, doc.content.encode("utf-8")) for doc in data.corpus]
    index_documents(documents, name=data.name, zone=zone, settings=settings, republish=republish, timeout=timeout)


Metric = Callable[[Sequence[str], Mapping[str, int], int], float]


@dataclass
class _Pass:
    """Every query asked once at one k: per query the documents ranked (each at its best chunk), and the
    client's and the server's latency."""

    ranked: dict[str, list[str]]
    latency_ms: list[float]
    server_ms: list[float]

    def mean(self, data: BeirDataset, metric: Metric, k: int) -> float:
        """``metric`` at ``k`` over the queries, to 4 places."""
        total = sum(metric(ranked, data.qrels[qid], k) for qid, ranked in self.ranked.items())
        return round(total / len(self.ranked), 4)


def _ask(data: BeirDataset, query_ids: list[str], *, mode: Mode, zone: str, client: SearchClient,
         options: dict[str, Any], k: int, desc: str) -> _Pass:
    done = _Pass(ranked={}, latency_ms=[], server_ms=[])
    for qid in tqdm(query_ids, desc=desc, unit="query"):
        started = time.perf_counter()
        answer = client.search(data.queries[qid], zone, k=k, mode=mode.value, **options)
        done.latency_ms.append((time.perf_counter() - started) * 1000)
        done.server_ms.append(answer["timings_ms"]["total"])
        done.ranked[qid] = list(dict.fromkeys(hit["path"] for hit in answer["results"]))
    return done


def _score(
    data: BeirDataset, query_ids: list[str], *, mode: Mode, zone: str, client: SearchClient, options: dict[str, Any]
) -> dict[str, Any]:
    done = _ask(data, query_ids, mode=mode, zone=zone, client=client, options=options, k=RETRIEVE_K,
                desc=f"querying ({mode.value})")
    return {
        "ndcg@10": done.mean(data, ndcg_at_k, 10),
        "recall@100": done.mean(data, recall_at_k, 100),
        "mrr@10": done.mean(data, mrr_at_k, 10),
        "latency_p50_ms": round(percentile(done.latency_ms, 50), 2),
        "latency_p95_ms": round(percentile(done.latency_ms, 95), 2),
        "server_p50_ms": round(percentile(done.server_ms, 50), 2),
        "queries": len(query_ids),
    }


def _at_k(
    data: BeirDataset, query_ids: list[str], *, mode: Mode, zone: str, client: SearchClient,
    options: dict[str, Any], k: int,
) -> dict[str, Any]:
    """Every query asked at ``k``, as a user would: client and server latency, and nDCG@10 / MRR@10 of the
    answer. They can differ from the k=100 pass's: a search's leg depths and the candidates it boosts
    (``query.rerank_depth``, not its k × over-fetch) follow k."""
    done = _ask(data, query_ids, mode=mode, zone=zone, client=client, options=options, k=k,
                desc=f"asking ({mode.value}, k={k})")
    return {
        f"k{k}_ndcg@10": done.mean(data, ndcg_at_k, 10),
        f"k{k}_mrr@10": done.mean(data, mrr_at_k, 10),
        f"k{k}_latency_p50_ms": round(percentile(done.latency_ms, 50), 2),
        f"k{k}_latency_p95_ms": round(percentile(done.latency_ms, 95), 2),
        f"k{k}_server_p50_ms": round(percentile(done.server_ms, 50), 2),
    }


def _table(
    report: dict[str, dict[str, Any]], *, dataset: str, queries: int, shards: int, first_column: str = "mode"
) -> str:
    header = (f"{dataset}: {queries} judged queries, {shards} shard(s); scored at k={RETRIEVE_K}; latency through "
              "the shardfuse.search RPC (kN_*: a second pass at k=N, as a user asks)")
    cols = ["ndcg@10", "recall@100", "mrr@10", "latency_p50_ms", "latency_p95_ms", "server_p50_ms"]
    extra = {c for row in report.values() for c in row if re.match(r"k\d+_", c)}
    cols += sorted(extra, key=lambda c: (not c.endswith(("ndcg@10", "mrr@10")), c))
    width = max(16, *(len(c) + 2 for c in cols))
    lines = [header, f"{first_column:<12}" + "".join(f"{c:>{width}}" for c in cols)]
    for mode, row in report.items():
        lines.append(f"{mode:<12}" + "".join(f"{row.get(c, '-'):>{width}}" for c in cols))
    return "\n".join(lines)
