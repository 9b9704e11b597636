"""Removing what a shard's directory no longer needs: old generations and deltas, leftovers of crashed builders."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from shardfuse.pipeline.index.lexical.layout import (
    MANIFEST_TMP_PREFIX,
    STAGING_PREFIX,
    parse_delta_dir_name,
    parse_generation_dir_name,
)

# A staging directory or manifest temp file this old belongs to a builder that crashed: no live build
# takes a day, and deleting a live one would only make that build fail, never corrupt a published one.
_STALE_LEFTOVER_SECONDS = 24 * 3600


def collect_garbage(directory: Path, *, keep_generations: int, published: int, delta: str = "") -> None:
    """Delete generations beyond the newest ``keep_generations``, deltas beyond the newest two (never the
    published ones) and leftovers of crashed builders. Call under the shard lock."""
    generations: list[tuple[int, Path]] = []
    deltas: list[tuple[int, Path]] = []
    now = time.time()
    for entry in directory.iterdir():
        generation = parse_generation_dir_name(entry.name)
        number = parse_delta_dir_name(entry.name)
        if generation is not None:
            generations.append((generation, entry))
        elif number is not None:
            deltas.append((number, entry))
        elif _stale_leftover(entry, now):
            _remove(entry)
    generations.sort(reverse=True)
    for generation, path in generations[keep_generations:]:
        if generation != published:
            _remove(path)
    # A reader loads a delta whole (it is small), so one older delta is enough for readers mid-switch.
    deltas.sort(reverse=True)
    for _, path in deltas[2:]:
        if path.name != delta:
            _remove(path)


def _stale_leftover(entry: Path, now: float) -> bool:
    """Whether ``entry`` is a staging directory or temporary manifest that a crashed builder left behind: one
    untouched for longer than any build takes (a younger one may belong to a build under way)."""
    if not entry.name.startswith((STAGING_PREFIX, MANIFEST_TMP_PREFIX)):
        return False
    try:
        return now - entry.stat().st_mtime > _STALE_LEFTOVER_SECONDS
    except FileNotFoundError:  # removed meanwhile
        return False


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
