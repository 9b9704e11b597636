"""Query-stage timings, measured side by side in one run (``make bench``).

- the router against its 5 ms budget, on every SciFact and CoSQA query plus a 4096-character one;
- the local embedder's per-query cost through ONNX Runtime against torch, same model, same queries.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from shardfuse.query.evaluation import load_beir
from shardfuse.query.router import route

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ROUTER_BUDGET_MS = 5.0


def _queries() -> list[str]:
    queries: list[str] = []
    for name, split in (("scifact", "test"), ("cosqa", "test")):
        if (DATA / name).is_dir():
            queries += load_beir(DATA / name, split=split).queries.values()
    if not queries:
        pytest.skip(f"no datasets under {DATA}")
    return queries


def _timings_ms(fn: Callable[[str], object], inputs: Sequence[str]) -> list[float]:
    for text in inputs[:5]:
        fn(text)  # warm
    out = []
    for text in inputs:
        started = time.perf_counter()
        fn(text)
        out.append((time.perf_counter() - started) * 1000)
    return out


def _summary(ms: list[float]) -> str:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ms):.3f} ms, p99 {p99:.3f} ms, max {max(ms):.3f} ms over {len(ms)}"


def test_router_is_far_inside_its_budget() -> None:
    queries = _queries() + ["compare " + "word " * 818]  # a 4096-character query
    ms = _timings_ms(route, queries)
    # Reported, not asserted: a timing on a shared machine is not a pass/fail test.
    print(f"\nrouter: {_summary(ms)}; budget {ROUTER_BUDGET_MS} ms, worst case uses "
          f"{max(ms) / ROUTER_BUDGET_MS:.1%} of it ({'within' if max(ms) < ROUTER_BUDGET_MS else 'OVER'} budget)")


def test_onnx_runtime_embeds_a_query_faster_than_torch(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("onnxruntime")
    from shardfuse.pipeline.embed.providers import LocalEmbedder

    queries = _queries()[:200]
    onnx = LocalEmbedder(runtime="onnx", cache_dir=tmp_path)
    torch = LocalEmbedder(runtime="torch")
    onnx_ms, torch_ms = _timings_ms(onnx.embed_query, queries), _timings_ms(torch.embed_query, queries)
    ratio = statistics.median(torch_ms) / statistics.median(onnx_ms)
    print(f"\nembed_query onnx:  {_summary(onnx_ms)}\nembed_query torch: {_summary(torch_ms)}\n"
          f"torch / onnx p50 = {ratio:.2f}x ({'onnx faster' if ratio > 1.0 else 'onnx NOT faster'})")
