"""Build one shard's BM25 index from its chunks and publish it as a new generation.

The expensive part (tokenising, scoring, writing files) happens in a private staging directory without
any lock, so concurrent builders of one shard only serialise on the short publish step: under the shard's
publish lock (:mod:`.publishing`) the builder picks the next generation number, renames its staging directory
to ``gen_<g>``, publishes the manifest and removes generations beyond ``keep_generations``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import bm25s
import numpy as np

from shardfuse.pipeline.core.durable_files import fsync_dir, fsync_tree
from shardfuse.pipeline.index.lexical.doc_keys import doc_key_array
from shardfuse.pipeline.index.lexical.layout import (
    BASE_STATS_FILE,
    CHUNK_IDS_FILE,
    DOC_KEY_ORDER_FILE,
    DOC_KEYS_FILE,
    STAGING_PREFIX,
    ZONE_CODES_FILE,
    ZONE_NAMES_FILE,
    generation_dir_name,
    parse_generation_dir_name,
    shard_dir,
)
from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.lexical.publishing import LocalPublishing, ShardPublishing
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

class CatchUp(NamedTuple):
    """A delta a merge publishes with its new generation: the writes that landed during the build."""

    directory: str  # the installed delta directory ("" when there was nothing to catch up)
    built_version: int
    docs: int
    masked: int
    built_snapshot: str = ""  # the snapshot the catch-up read its documents at (manifest.built_snapshot)


def build_shard_index(
    root: Path,
    shard: int,
    *,
    chunk_ids: Sequence[str],
    zones: Sequence[str],
    texts: Sequence[str],
    built_version: int,
    k1: float = 1.5,
    b: float = 0.75,
    keep_generations: int = 2,
    tokenizer: Tokenizer | None = None,
    paths: Sequence[str] | None = None,
    catch_up: Callable[[Path], CatchUp | None] | None = None,
    built_snapshot: str = "",
    replace_any: bool = False,
    publishing: ShardPublishing | None = None,
) -> ShardManifest:
    """Index ``texts`` (aligned with ``chunk_ids`` and ``zones``) as a new generation of ``shard``.

    Returns the manifest now published. If another builder has meanwhile published a newer
    ``built_version``, this build is discarded and that manifest is returned instead, so a slow builder
    never rolls the index back to older content. With ``paths`` (each chunk's document path) the
    generation can take delta segments (``delta.py``); ``catch_up``, called under the shard lock with the
    new generation's directory, may install a delta covering writes that landed during the build, published
    together with it. ``built_snapshot`` is the PostgreSQL snapshot the texts were read at (see
    :class:`ShardManifest`); a catch-up's replaces it. ``replace_any`` publishes even over a higher
    published version (whose versions came from another database: a restore into a new cluster).
    ``publishing`` is where the generation is published (default: :class:`LocalPublishing` into ``root``).
    Generations older than the newest ``keep_generations`` are deleted after publishing; readers that still
    map them keep working (unlinked files stay readable while mapped), and readers that had not loaded them
    yet reload the current manifest.
    """
    if paths is not None and len(paths) != len(chunk_ids):
        raise ValueError(f"paths ({len(paths)}) and chunk_ids ({len(chunk_ids)}) differ in length")
    if not len(chunk_ids) == len(zones) == len(texts):
        raise ValueError(f"chunk_ids, zones and texts differ in length ({len(chunk_ids)}, {len(zones)}, {len(texts)})")
    if keep_generations < 1:
        raise ValueError(f"keep_generations must be at least 1, got {keep_generations}")
    if shard < 0:
        raise ValueError(f"shard must be non-negative, got {shard}")

    directory = shard_dir(root, shard)
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory))
    try:
        # mkdtemp creates 0700; query workers may run as another user on the shared filesystem.
        staging.chmod(0o755)
        tokenizer = tokenizer or Tokenizer()
        vocab_size = _write_generation(
            staging, chunk_ids=chunk_ids, zones=zones, texts=texts, k1=k1, b=b, tokenizer=tokenizer, paths=paths
        )
        fsync_tree(staging)
        publishing = publishing or LocalPublishing(root, shard)
        with publishing.lock():
            current = publishing.current()
            # With a catch-up delta, the new generation replaces the published one's delta too.
            floor = (current.generation_version if catch_up is not None else current.built_version) if current else 0
            # A manifest whose versions came from Redis's counter is on another scale: never a reason to
            # keep it over a build that read a PostgreSQL snapshot.
            comparable = current is not None and not replace_any and (current.tracks_postgres or not built_snapshot)
            if current is not None and comparable and floor > built_version:
                logger.info(
                    "shard %d: discarding BM25 build of version %d, version %d is already published",
                    shard,
                    built_version,
                    current.built_version,
                )
                return current
            generation = _next_generation(directory, current)
            name = generation_dir_name(generation)
            os.rename(staging, directory / name)
            fsync_dir(directory)
            caught = catch_up(directory / name) if catch_up is not None and vocab_size > 0 else None
            manifest = ShardManifest(
                shard=shard,
                generation=generation,
                built_version=max(built_version, caught.built_version) if caught else built_version,
                base_version=built_version,
                delta=caught.directory if caught else "",
                delta_docs=caught.docs if caught else 0,
                delta_masked=caught.masked if caught else 0,
                delta_created_at=time.time() if caught and caught.directory else 0.0,
                doc_count=len(chunk_ids),
                directory=name,
                created_at=time.time(),
                k1=k1,
                b=b,
                vocab_size=vocab_size,
                tokenizer=tokenizer.name,
                built_snapshot=caught.built_snapshot if caught else built_snapshot,
            )
            publishing.publish(manifest)
            publishing.collected(keep_generations=keep_generations, manifest=manifest)
        return manifest
    finally:
        # Gone after a successful rename; otherwise the build failed or was discarded.
        shutil.rmtree(staging, ignore_errors=True)


def _write_generation(
    target: Path,
    *,
    chunk_ids: Sequence[str],
    zones: Sequence[str],
    texts: Sequence[str],
    k1: float,
    b: float,
    tokenizer: Tokenizer,
    paths: Sequence[str] | None = None,
) -> int:
    """Write one generation's files into ``target``; return the vocabulary size (0: no bm25s files)."""
    if not chunk_ids:
        return 0
    # Fixed-width unicode arrays load with mmap and without pickle; row i is bm25s document i.
    np.save(target / CHUNK_IDS_FILE, np.asarray(list(chunk_ids), dtype=np.str_), allow_pickle=False)
    zone_names, zone_codes = np.unique(np.asarray(list(zones), dtype=np.str_), return_inverse=True)
    np.save(target / ZONE_CODES_FILE, zone_codes.astype(np.int32).reshape(-1), allow_pickle=False)
    (target / ZONE_NAMES_FILE).write_text(json.dumps([str(z) for z in zone_names]), encoding="utf-8")

    # Chunks without tokens stay in the corpus as empty documents so bm25s doc ids stay aligned with the
    # arrays above; they can never score above zero.
    corpus_tokens = [tokenizer(text) for text in texts]
    vocab_size = len({token for tokens in corpus_tokens for token in tokens})
    if vocab_size == 0:
        # bm25s cannot index a corpus without a single token (its empty-token bookkeeping calls max() on
        # an empty vocabulary), and such an index could never return a hit anyway.
        return 0
    retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
    retriever.index(corpus_tokens, show_progress=False)
    retriever.save(target, show_progress=False)
    if paths is not None:
        keys = doc_key_array(zones, paths)
        np.save(target / DOC_KEYS_FILE, keys, allow_pickle=False)
        np.save(target / DOC_KEY_ORDER_FILE, np.argsort(keys, kind="stable").astype(np.int64), allow_pickle=False)
        # bm25s's average length: every document's token count, empty ones included.
        avgdl = sum(len(tokens) for tokens in corpus_tokens) / len(corpus_tokens)
        (target / BASE_STATS_FILE).write_text(json.dumps({"avgdl": avgdl, "docs": len(corpus_tokens)}),
                                              encoding="utf-8")
    return vocab_size


def _next_generation(directory: Path, current: ShardManifest | None) -> int:
    """One more than any generation published or present on disk (the manifest may be corrupt)."""
    on_disk = [parse_generation_dir_name(entry.name) for entry in directory.iterdir()]
    highest = max([g for g in on_disk if g is not None], default=0)
    if current is not None:
        highest = max(highest, current.generation)
    return highest + 1
