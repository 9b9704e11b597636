"""The scale benchmark's figures as plain data (no stack, no plotting): which sizes to run, the results file
(one entry per corpus size, kept across runs so a size can be run on its own), and /proc status fields.

Used by :mod:`tests.benchmarks.scale_growth` (which measures) and :mod:`tests.benchmarks.scale_plot` (which draws).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

SIZES_VARIABLE = "SHARDFUSE_SCALE_SIZES"
RESULTS_VARIABLE = "SHARDFUSE_SCALE_RESULTS"
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
DEFAULT_RESULTS = Path(__file__).resolve().parents[2] / "docs" / "figures" / "scale.json"
_SI = {"k": 1_000, "m": 1_000_000}


def parse_sizes(text: str | None) -> list[int]:
    """Corpus sizes in chunks from ``"10000,100000,1000000"`` (``10k``/``1M`` allowed), ascending, distinct;
    the default sizes for an empty or missing value. A size must be a positive whole number."""
    if text is None or not text.strip():
        return list(DEFAULT_SIZES)
    sizes = set()
    for item in text.split(","):
        word = item.strip().lower().replace("_", "")
        factor = _SI.get(word[-1:], 1) if word else 1
        digits = word[:-1] if factor > 1 else word
        if not digits.isdigit() or int(digits) * factor <= 0:
            raise ValueError(f"{SIZES_VARIABLE}: {item.strip()!r} is not a positive number of chunks "
                             "(e.g. 10000,100000,1000000 or 10k,100k,1M)")
        sizes.add(int(digits) * factor)
    return sorted(sizes)


def sizes_from_environment(environ: Mapping[str, str] = os.environ) -> list[int]:
    return parse_sizes(environ.get(SIZES_VARIABLE))


def results_path(environ: Mapping[str, str] = os.environ) -> Path:
    value = environ.get(RESULTS_VARIABLE, "").strip()
    return Path(value) if value else DEFAULT_RESULTS


def merged(existing: Sequence[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``existing`` entries with those of the sizes in ``new`` replaced by ``new``'s, ordered by size."""
    by_size = {int(entry["chunks_target"]): dict(entry) for entry in existing}
    by_size.update({int(entry["chunks_target"]): dict(entry) for entry in new})
    return [by_size[size] for size in sorted(by_size)]


def read_results(path: Path) -> list[dict[str, Any]]:
    """The entries of a results file (none if it does not exist); a file that is not one says so."""
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON ({exc}); move it away to start a new results file") from exc
    sizes = data.get("sizes") if isinstance(data, dict) else None
    if not isinstance(sizes, list) or not all(isinstance(e, dict) and "chunks_target" in e for e in sizes):
        raise ValueError(f"{path} is not a scale results file: expected {{\"sizes\": [{{\"chunks_target\": …}}]}}")
    return sizes


def write_results(path: Path, entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Merge ``entries`` into the results file at ``path`` (created with its folder); returns what it holds."""
    everything = merged(read_results(path), entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bench": "scale", "sizes": everything}, indent=1, sort_keys=True) + "\n",
                    encoding="utf-8")
    return everything


def status_fields(text: str) -> dict[str, float]:
    """The ``kB`` fields of a ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM`` …), in MiB."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[key] = int(parts[0]) / 1024
    return out


def pool_memory(statuses: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A worker pool's memory from its processes' status fields (main process and children): the sum of
    their resident sets (shared pages counted once per process, as ``VmRSS`` counts them), the largest
    process's resident set, and the largest peak (``VmHWM``), in MiB."""
    return {"rss_mb": round(sum(s.get("VmRSS", 0.0) for s in statuses), 1),
            "largest_rss_mb": round(max((s.get("VmRSS", 0.0) for s in statuses), default=0.0), 1),
            "peak_rss_mb": round(max((s.get("VmHWM", 0.0) for s in statuses), default=0.0), 1),
            "processes": len(statuses)}


def paired_order(n: int) -> list[tuple[int, int]]:
    """Index pairs that run each of ``n`` queries once in each of two ways, side by side: step ``i`` runs
    query ``i`` one way and query ``i + n // 2`` (wrapping) the other, so neither way meets a query the other
    has just warmed."""
    return [(i, (i + n // 2) % n) for i in range(n)]
