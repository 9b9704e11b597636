"""Where a shard's BM25 index lives on disk.

::

    <root>/shard_<i>/MANIFEST.json     the published generation (replaced atomically)
    <root>/shard_<i>/.lock             flock target serialising publishers
    <root>/shard_<i>/gen_<g>/          one immutable generation: bm25s files + the arrays below
    <root>/shard_<i>/.staging-*/       a generation being written, renamed to gen_<g> on publish
    <root>/shard_<i>/delta_<n>/        one immutable delta segment over a generation (see ``delta.py``)
"""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST_NAME = "MANIFEST.json"
LOCK_NAME = ".lock"
STAGING_PREFIX = ".staging-"
MANIFEST_TMP_PREFIX = ".MANIFEST."

# Files written next to the bm25s files in a generation directory. Row i of each belongs to bm25s doc i.
CHUNK_IDS_FILE = "chunk_ids.npy"
ZONE_CODES_FILE = "zone_codes.npy"
ZONE_NAMES_FILE = "zones.json"
# Per row, a 64-bit hash of the chunk's document ``(zone, path)``; and the base statistics a delta segment
# is scored with. A generation without them (built before deltas existed) is merged, never given a delta.
DOC_KEYS_FILE = "doc_keys.npy"
DOC_KEY_ORDER_FILE = "doc_key_order.npy"
BASE_STATS_FILE = "lexical_stats.json"
# A delta segment's arrays and its description.
DELTA_ARRAYS_FILE = "delta.npz"
DELTA_META_FILE = "delta.json"
# Written by ``bm25s.BM25.save``; its presence tells a reader a bm25s index exists in the directory.
BM25_PARAMS_FILE = "params.index.json"

_GENERATION_DIR = re.compile(r"gen_(\d+)")
_DELTA_DIR = re.compile(r"delta_(\d+)")


def shard_dir(root: Path, shard: int) -> Path:
    """The directory holding every generation and the manifest of one shard."""
    return root / f"shard_{shard}"


def manifest_path(root: Path, shard: int) -> Path:
    """The path of a shard's published manifest."""
    return shard_dir(root, shard) / MANIFEST_NAME


def generation_dir_name(generation: int) -> str:
    """The directory name of generation ``generation``."""
    return f"gen_{generation}"


def parse_generation_dir_name(name: str) -> int | None:
    """The generation number a directory name stands for, or None when it is not a generation dir."""
    match = _GENERATION_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


def delta_dir_name(number: int) -> str:
    """The directory name of delta segment ``number`` (numbers increase per shard)."""
    return f"delta_{number}"


def parse_delta_dir_name(name: str) -> int | None:
    """The delta number a directory name stands for, or None when it is not a delta dir."""
    match = _DELTA_DIR.fullmatch(name)
    return int(match.group(1)) if match else None
