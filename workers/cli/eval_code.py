"""``shardfuse eval-code``: index a Python source tree through the running stack and score code search on it.

The questions (:mod:`shardfuse.query.evaluation.code_sampling`): a sample of the tree's definitions asked for
by bare name (found: at rank 1) and by their docstring's first sentence with the name removed (found: in the
top 5); scoring in :mod:`shardfuse.query.evaluation.code_scoring`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shardfuse.pipeline.admin.sources import iter_source_files
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.query.evaluation.code_sampling import CodeCase, find_definitions, sample_cases
from shardfuse.query.evaluation.code_scoring import Outcome, format_misses, format_table, outcome, summarize
from shardfuse.query.request import Mode
from shardfuse.workers.cli import arguments
from shardfuse.workers.cli.eval_indexing import index_documents
from shardfuse.workers.cli.querying import add_stage_switches, search_options
from shardfuse.workers.client import SearchClient

RETRIEVE_K = 10  # deep enough for MRR@10 and to see where a miss landed


def register(sub: Any) -> None:
    p = sub.add_parser("eval-code", help="index a Python source tree and score code search: a definition's bare "
                                         "name at rank 1, its docstring's first sentence in the top 5")
    p.add_argument("source", type=Path, metavar="SOURCE_DIR")
    p.add_argument("--zone", type=arguments.zone, help="zone to index into (default: code-<directory name>)")
    p.add_argument("--samples", type=arguments.positive_int, default=200, metavar="N",
                   help="definitions sampled for each kind of query (default 200)")
    p.add_argument("--seed", type=int, default=22, help="the sample's random seed (default 22)")
    p.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.HYBRID.value)
    p.add_argument("--strip-parts", action="store_true",
                   help="remove the name's identifier parts from docstring queries too, not only the name")
    add_stage_switches(p)
    p.add_argument("--republish", action="store_true", help="publish the tree even if the zone holds it")
    p.add_argument("--timeout", type=arguments.positive_float, default=3600.0, help="seconds to wait for indexing")
    p.add_argument("--misses", action="store_true", help="list every case not found, with the results ahead of it")
    p.add_argument("--json", action="store_true", help="also print one JSON object last")
    p.set_defaults(handler=run_eval_code)


def run_eval_code(args: argparse.Namespace, settings: Settings) -> int:
    if args.samples < 1:
        raise ConfigurationError("--samples must be at least 1")
    source = Path(args.source)
    documents = read_tree(source)
    if not documents:
        raise ConfigurationError(f"{source} holds no Python files (*.py)")
    definitions = [d for path, text in documents.items() for d in find_definitions(path, text)]
    cases = sample_cases(definitions, n=args.samples, seed=args.seed, strip_parts=args.strip_parts)
    if not cases:
        raise ConfigurationError(f"{source} defines no name exactly once: nothing to ask")
    zone = args.zone or "code-" + re.sub(r"[^A-Za-z0-9_.\-]", "-", source.resolve().name)
    index_documents([(path, text.encode("utf-8")) for path, text in documents.items()], name=source.name,
                    zone=zone, settings=settings, republish=args.republish, timeout=args.timeout)
    outcomes = ask(cases, zone=zone, client=SearchClient(settings),
                   options={**search_options(args), "mode": args.mode, "cache": False})
    summary = summarize(outcomes)
    title = (f"{source.name}: {len(documents)} files, {len(definitions)} definitions, "
             f"{len({d.name for d in definitions})} distinct names; {args.mode}, seed {args.seed}")
    print(format_table(summary, title=title))
    if args.misses:
        print(format_misses(outcomes) or "no misses")
    if args.json:
        print(json.dumps({"source": source.name, "files": len(documents), "definitions": len(definitions),
                          "mode": args.mode, "seed": args.seed, "strip_parts": args.strip_parts, **summary}))
    return 0 if all(row["passed"] for row in summary.values()) else 1


def read_tree(source: Path) -> dict[str, str]:
    """The ``*.py`` files under ``source`` (``.gitignore`` honoured), by document path: relative to the tree's
    parent, so ``celery/app/base.py``. A file that is not UTF-8 is left out, with a note."""
    if not source.is_dir():
        raise ConfigurationError(f"{source} is not a directory")
    documents: dict[str, str] = {}
    for file in iter_source_files([source], base=source.resolve().parent):
        if file.path.suffix != ".py":
            continue
        try:
            documents[file.name] = file.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"shardfuse eval-code: skipping {file.name}: {exc}", file=sys.stderr)
    return documents


def ask(cases: list[CodeCase], *, zone: str, client: SearchClient, options: dict[str, Any]) -> list[Outcome]:
    """Search every case and score it."""
    return [outcome(case, client.search(case.query, zone, k=RETRIEVE_K, **options)["results"])
            for case in tqdm(cases, desc="querying", unit="query")]

