"""``shardfuse explain-chunks`` (how a file would be chunked, scored and contextualized) and
``shardfuse backfill-context`` (LLM contexts for chunks that fell back to headings)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.index.store import ShardPools
from shardfuse.pipeline.index.store.inspection import backfill_events
from shardfuse.pipeline.ingest.chunk_filter import ChunkVerdict, filter_chunks
from shardfuse.pipeline.ingest.decode import Skipped, decode_content, too_large
from shardfuse.pipeline.ingest.preparation import PreparedChunks, filter_settings, prepare_chunks
from shardfuse.workers.cli import arguments
from shardfuse.workers.publishing import CeleryEventSink


def register(sub: Any) -> None:
    explain = sub.add_parser("explain-chunks",
                             help="show how a file is chunked: each chunk's lines, symbols, score, fate and context")
    explain.add_argument("path", type=Path, metavar="PATH", help="a local file")
    explain.add_argument("--zone", required=True, type=arguments.zone, help="the zone it would be published to")
    explain.add_argument("--as", dest="as_path", metavar="NAME",
                         help="the document path it would have (default: PATH as given)")
    explain.add_argument("--json", action="store_true", help="one JSON object per chunk")
    explain.set_defaults(handler=run_explain)
    backfill = sub.add_parser("backfill-context",
                              help="re-index the documents whose chunks wait for an LLM context")
    backfill.add_argument("--zone", required=True, type=arguments.zone)
    backfill.set_defaults(handler=run_backfill)


def run_explain(args: argparse.Namespace, settings: Settings) -> int:
    """Chunks and scores a local file as ingest would (headings context; no LLM call is made)."""
    limit = settings.limits.max_file_bytes
    try:
        with args.path.open("rb") as source:  # ingest decides "too large" from the size, and so does this
            raw = source.read(limit + 1)
            size = os.fstat(source.fileno()).st_size
    except OSError as exc:
        print(f"shardfuse explain-chunks: cannot read {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    # A device has no size: its limit + 1 bytes read are too large for decode_content itself.
    decoded = too_large(size, max_bytes=limit) if size > limit else decode_content(raw, max_bytes=limit)
    if isinstance(decoded, Skipped):
        print(f"{args.path}: not indexed: {decoded.reason}")
        return 0
    name = args.as_path or args.path.as_posix()
    counter = TokenCounter(settings.chunking.encoding, bpe_dir=settings.chunking.bpe_dir)
    headings = settings.model_copy(update={"context": settings.context.model_copy(update={"source": "headings"})})
    prepared = prepare_chunks(decoded.text, path=name, doc_hash="explain", settings=headings, counter=counter)
    # The verdicts are shown even with the filter off, to see what it would do.
    verdicts = prepared.verdicts or tuple(
        filter_chunks([c.text for c in prepared.candidates], counter=counter, settings=filter_settings(settings)))
    rows = _explain_rows(prepared, verdicts, filtering=settings.entropy.enabled)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    state = "on" if settings.entropy.enabled else "off"
    print(f"{name} in zone {args.zone}: {len(rows)} chunk(s), {len(prepared.chunks)} kept "
          f"(entropy filter {state}, threshold {settings.entropy.threshold})")
    _print_rows(rows)
    return 0


def _explain_rows(prepared: PreparedChunks, verdicts: Sequence[ChunkVerdict], *,
                  filtering: bool) -> list[dict[str, Any]]:
    """One row per chunk the strategy made: where it is, its filter scores, its fate and its context."""
    kept = iter(prepared.chunks)
    rows: list[dict[str, Any]] = []
    for chunk, verdict in zip(prepared.candidates, verdicts, strict=True):
        dropped = filtering and not verdict.kept
        rows.append({
            "ordinal": chunk.ordinal, "lines": [chunk.start_line, chunk.end_line], "tokens": chunk.token_count,
            "heading_path": list(chunk.heading_path), "symbols": chunk.symbols.to_json(),
            "score": verdict.score, "entity_novelty": verdict.entity_novelty,
            "semantic_novelty": verdict.semantic_novelty, "entropy_bits": round(verdict.entropy_bits, 3),
            "fate": _fate(verdict, filtering=filtering), "context": "" if dropped else next(kept).context,
        })
    return rows


def _fate(verdict: ChunkVerdict, *, filtering: bool) -> str:
    if verdict.kept:
        return "kept"
    if filtering:
        return f"dropped ({verdict.reason})"
    return f"kept (filter off; would drop: {verdict.reason})"


def _print_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        score = "-" if row["score"] is None else f"{row['score']:.2f}"
        symbols = row["symbols"] or {}
        where = " > ".join(row["heading_path"]) or (symbols.get("primary") or "")
        print(f"#{row['ordinal']:<3} lines {row['lines'][0]}-{row['lines'][1]:<6} {row['tokens']:>4} tok  "
              f"score {score:>4}  entropy {row['entropy_bits']:.2f}  {row['fate']}")
        if where:
            print(f"     {where}")
        if row["context"]:
            print(f"     context: {row['context']}")


def run_backfill(args: argparse.Namespace, settings: Settings) -> int:
    """Re-publishes, at their own seq, the zone's documents that have chunks marked for backfill."""
    if settings.context.source != "llm":
        raise ConfigurationError(
            f"context.source is {settings.context.source!r}: backfill-context needs the llm source "
            "(SHARDFUSE_CONTEXT__SOURCE=llm and a chat model the workers can reach)"
        )
    with ShardPools(settings, min_size=1, max_size=1) as pools:
        events = [event for store in pools.stores() for event in backfill_events(store, args.zone)]
    with CeleryEventSink.connect(settings, refresh=True) as sink:
        for event in events:
            sink.send(event)
    print(f"re-published {len(events)} document(s) of zone {args.zone!r} for LLM contexts "
          f"({sink.messages} message(s)); `shardfuse wait` waits for them")
    return 0
