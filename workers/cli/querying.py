"""``shardfuse search``: the thin RPC through the broker to a query worker."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.query.fusion import Fusion
from shardfuse.query.request import ARGUMENTS, Mode
from shardfuse.workers.cli import arguments
from shardfuse.workers.client import remote_search

# The search task's arguments a command line sets as options (the query and the zones are its own).
OPTIONS = tuple(name for name in ARGUMENTS if name not in {"query", "zone", "zones"})


def register(sub: Any) -> None:
    search = sub.add_parser("search", help="search a zone through the shardfuse.search RPC task")
    search.add_argument("query")
    search.add_argument("--zone", required=True, action="append", type=arguments.zone, dest="zone_names",
                        metavar="ZONE",
                        help="the zone to search; repeat it to search several zones as one")
    search.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.HYBRID.value)
    search.add_argument("-k", type=int, default=10, help="number of results (default 10)")
    search.add_argument("--fusion", choices=[f.value for f in Fusion], help="default: query.fusion")
    search.add_argument("--alpha", type=float, help="vector leg weight in weighted fusions (default: query.alpha)")
    search.add_argument("--path-prefix", help="only documents whose path starts with this")
    search.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                        help="only documents whose metadata has KEY equal to VALUE (repeatable)")
    search.add_argument("--model", help="search with this embedding model (default: the zone's own; name a model "
                        "a reindex is filling to compare it before `shardfuse reindex switch`)")
    search.add_argument("--min-score", type=float, help="leave out results whose final score is below this "
                        "(fused and boosted: compare within one fusion only)")
    search.add_argument("--min-similarity", type=float,
                        help="drop vector candidates less similar (cosine, -1 to 1) than this before fusion")
    search.add_argument("--keyword-depth", type=int, help="candidates the keyword leg brings to fusion")
    search.add_argument("--vector-depth", type=int, help="candidates the vector leg brings to fusion")
    search.add_argument("--include-text", action=argparse.BooleanOptionalAction, default=None,
                        help="results with their text (default) or without (--no-include-text)")
    search.add_argument("--max-per-file", type=int, help="at most this many results from one file (1: distinct "
                        "documents; 0: no cap; default: query.max_chunks_per_file)")
    search.add_argument("--grep", action="store_const", const=Mode.GREP.value, dest="mode",
                        help="the lines holding the query verbatim (same as --mode grep)")
    search.add_argument("--regex", action="store_const", const=True, help="grep for the query as an RE2 regex")
    search.add_argument("--case-sensitive", action=argparse.BooleanOptionalAction, default=None,
                        help="grep case-sensitively (the default) or not (--no-case-sensitive)")
    search.add_argument("--json", action="store_true", help="print the task's JSON answer")
    add_stage_switches(search)
    search.set_defaults(handler=run_search)


def add_stage_switches(parser: Any) -> None:
    """``--boost/--no-boost``, ``--route/--no-route``, ``--expand/--no-expand``, ``--rerank/--no-rerank``:
    per-request ranking stages."""
    for stage, what in (("boost", "field, exactness and symbol boosts"), ("route", "the query router"),
                        ("expand", "LLM query expansion"), ("rerank", "the reranker ([rerank])")):
        parser.add_argument(f"--{stage}", action=argparse.BooleanOptionalAction, default=None,
                            help=f"switch {what} on or off (default: as configured)")


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    """The search task's options the command line set (dest named as the argument); what it left unset the
    query worker's settings decide."""
    return {name: value for name in OPTIONS if (value := getattr(args, name, None)) is not None}


def run_search(args: argparse.Namespace, settings: Settings) -> int:
    filters = dict(item.split("=", 1) for item in args.filter if "=" in item)
    if len(filters) != len(args.filter):
        print("shardfuse search: --filter takes KEY=VALUE", file=sys.stderr)
        return 2
    try:
        answer = remote_search(settings, args.query, **_zones(args.zone_names), **search_options(args),
                               filters=filters or None)
    except StoreUnavailableError:
        raise  # no worker answered: main() reports it
    except Exception as exc:  # the worker's exception, rebuilt by Celery: print it as the user's error
        print(f"shardfuse search: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(answer, ensure_ascii=False))
        return 0
    print(format_results(answer))
    return 0


def _zones(names: list[str]) -> dict[str, Any]:
    """One ``--zone``: the task's ``zone``; several: its ``zones``."""
    return {"zone": names[0]} if len(names) == 1 else {"zones": names}


def format_results(answer: dict[str, Any], *, snippet_chars: int = 160) -> str:
    if answer["mode"] == Mode.GREP.value:
        return format_lines(answer)
    results = answer["results"]
    timings = answer["timings_ms"]
    model = f", model {answer['model']}" if answer.get("model", "default") != "default" else ""
    zones = answer.get("zones") or [answer["zone"]]
    scope = f"zone {zones[0]!r}" if len(zones) == 1 else f"zones {', '.join(repr(z) for z in zones)}"
    lines = [f"{len(results)} result(s) for {answer['query']!r} in {scope} "
             f"({answer['mode']}{model}, {timings.get('total', 0):.1f} ms)"]
    for hit in results:
        legs = ", ".join(
            f"{name} #{hit[f'{name}_rank']}" for name in ("keyword", "vector") if hit.get(f"{name}_rank")
        )
        where = hit.get("primary_symbol") or " > ".join(hit.get("heading_path") or [])
        role = f" ({hit['role']})" if hit.get("primary_symbol") and hit.get("role") else ""
        path = hit["path"] if len(zones) == 1 else f"{hit['zone']}:{hit['path']}"
        lines.append(f"{hit['rank']:>3}. {path}:{hit['start_line']}-{hit['end_line']}  "
                     f"{where + role + '  ' if where else ''}score {hit['score']:.4f}  [{legs}]")
        if "text" not in hit:  # --no-include-text
            continue
        snippet = " ".join(hit["text"].split())
        if len(snippet) > snippet_chars:
            snippet = snippet[: snippet_chars - 1] + "…"
        lines.append(f"     {snippet}")
    return "\n".join(lines)


def format_lines(answer: dict[str, Any]) -> str:
    """A grep answer as grep prints one: ``path:line: text``."""
    more = ", more not shown" if answer["truncated"] else ""
    lines = [f"{len(answer['results'])} line(s) for {answer['query']!r} in zone {answer['zone']!r} "
             f"(grep, {answer['timings_ms'].get('total', 0):.1f} ms{more})"]
    lines += [f"{hit['path']}:{hit['line']}: {hit.get('text', '')}" for hit in answer["results"]]
    return "\n".join(lines)
