"""Delta segments: the documents written since a shard's generation was built, searchable at once.

A full build costs time in proportion to the shard. A delta costs time in proportion to the documents
written since the generation (the *base*) was built: their current chunks are tokenised and scored here,
and the base rows of those documents (rewritten or deleted since) are listed to be masked out at query
time. Each delta is written whole, but from the previous one: only documents written since it are read
and tokenised again; the rest of its rows are copied as arrays. A merge (the full build) later folds
everything into a new base.

Scores stay those of a full build: a delta document's term weights use the base's average document length
(``lexical_stats.json``) and are stored *without* IDF; the reader multiplies them by the IDF of the live
documents (base minus masked, plus delta), the same IDF it swaps into the base's stored scores. Only the
average length is the base's rather than the live documents' (a small drift while the delta is small;
merges bound it).

On disk (``delta_<n>/``, immutable, published by the manifest's ``delta`` field)::

    delta.npz    chunk_ids, zone_codes, doc_keys: per delta row; masked_rows: base rows to mask (sorted);
                 indptr/indices/data: term-major sparse matrix of term-frequency components
    delta.json   base directory, zone names, terms, base average length
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.core.errors import PermanentError, StoreUnavailableError
from shardfuse.pipeline.index.lexical.doc_keys import doc_key, doc_key_array, rows_of
from shardfuse.pipeline.index.lexical.layout import (
    BASE_STATS_FILE,
    DELTA_ARRAYS_FILE,
    DELTA_META_FILE,
    DOC_KEY_ORDER_FILE,
    DOC_KEYS_FILE,
)
from shardfuse.pipeline.index.lexical.rows import Rows
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer


def has_base_stats(generation_dir: Path) -> bool:
    """Whether a generation can take a delta (built with document keys and statistics)."""
    return (generation_dir / BASE_STATS_FILE).is_file() and (generation_dir / DOC_KEYS_FILE).is_file()


def base_avgdl(generation_dir: Path) -> float:
    data: Any = json.loads((generation_dir / BASE_STATS_FILE).read_text(encoding="utf-8"))
    return float(data["avgdl"])


def lucene_tfc(tf: npt.NDArray[np.float32], dl: float, avgdl: float, k1: float, b: float) -> npt.NDArray[np.float32]:
    """bm25s's ``lucene`` term-frequency component: ``tf / (k1 (1 - b + b dl / avgdl) + tf)``."""
    return (tf / (np.float32(k1 * ((1 - b) + b * dl / avgdl)) + tf)).astype(np.float32)


def write_delta(
    target: Path,
    *,
    base_dir: Path,
    rows: Rows,
    touched: Iterable[tuple[str, str]],
    tokenizer: Tokenizer,
    k1: float,
    b: float,
    previous: Path | None = None,
) -> tuple[int, int]:
    """Write into ``target`` the delta over the generation in ``base_dir`` of ``rows``, the current chunks of
    the ``touched`` documents, on top of the ``previous`` delta over the same generation (whose rows of
    touched documents are dropped: only new writes are tokenised). Return (delta rows, masked base rows)."""
    avgdl = base_avgdl(base_dir)
    touched = list(touched)
    wanted = np.fromiter((doc_key(z, p) for z, p in touched), dtype=np.uint64, count=len(touched))
    keys = np.load(base_dir / DOC_KEYS_FILE, mmap_mode="r", allow_pickle=False)
    order = np.load(base_dir / DOC_KEY_ORDER_FILE, mmap_mode="r", allow_pickle=False)
    masked = rows_of(keys, order, wanted.tolist())

    vocab: dict[str, int] = {}
    term_ids: list[npt.NDArray[np.int64]] = []
    docs: list[npt.NDArray[np.int64]] = []
    tfcs: list[npt.NDArray[np.float32]] = []
    chunk_ids: list[npt.NDArray[np.str_]] = []
    zones: list[npt.NDArray[np.str_]] = []
    doc_keys: list[npt.NDArray[np.uint64]] = []
    kept = 0
    if previous is not None:
        meta: Any = json.loads((previous / DELTA_META_FILE).read_text(encoding="utf-8"))
        with np.load(previous / DELTA_ARRAYS_FILE, allow_pickle=False) as arrays:
            old = {name: arrays[name] for name in arrays.files}
        vocab = {str(t): i for i, t in enumerate(meta["terms"])}
        keep = ~np.isin(old["doc_keys"], wanted)
        renumber = np.cumsum(keep) - 1
        entry_terms = np.repeat(np.arange(len(vocab), dtype=np.int64), np.diff(old["indptr"]))
        entry_keep = keep[old["indices"]]
        term_ids.append(entry_terms[entry_keep])
        docs.append(renumber[old["indices"][entry_keep]].astype(np.int64))
        tfcs.append(old["data"][entry_keep])
        chunk_ids.append(old["chunk_ids"][keep])
        zones.append(np.asarray(meta["zones"], dtype=np.str_)[old["zone_codes"][keep]])
        doc_keys.append(old["doc_keys"][keep])
        masked = np.union1d(old["masked_rows"], masked).astype(np.int64)
        kept = int(np.count_nonzero(keep))
    for doc, text in enumerate(rows.texts, start=kept):
        tokens = tokenizer(text)
        if not tokens:
            continue
        counts = Counter(tokens)
        ids = np.fromiter((vocab.setdefault(t, len(vocab)) for t in counts), dtype=np.int64, count=len(counts))
        tf = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        term_ids.append(ids)
        docs.append(np.full(len(ids), doc, dtype=np.int64))
        tfcs.append(lucene_tfc(tf, float(len(tokens)), avgdl, k1, b))
    chunk_ids.append(np.asarray(rows.chunk_ids, dtype=np.str_))
    zones.append(np.asarray(rows.zones, dtype=np.str_))
    doc_keys.append(doc_key_array(rows.zones, rows.paths))
    all_terms = np.concatenate(term_ids) if term_ids else np.zeros(0, np.int64)
    by_term = np.argsort(all_terms, kind="stable")
    indices = (np.concatenate(docs)[by_term] if docs else np.zeros(0, np.int64)).astype(np.int32)
    data = (np.concatenate(tfcs)[by_term] if tfcs else np.zeros(0, np.float32)).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(all_terms, minlength=len(vocab)))]).astype(np.int64)
    zone_names, zone_codes = np.unique(np.concatenate(zones), return_inverse=True)
    all_ids = np.concatenate(chunk_ids)
    np.savez(
        target / DELTA_ARRAYS_FILE,
        chunk_ids=all_ids,
        zone_codes=zone_codes.astype(np.int32).reshape(-1),
        doc_keys=np.concatenate(doc_keys).astype(np.uint64),
        masked_rows=masked,
        indptr=indptr,
        indices=indices,
        data=data,
    )
    meta = {"base": base_dir.name, "zones": [str(z) for z in zone_names], "terms": list(vocab), "avgdl": avgdl}
    (target / DELTA_META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return len(all_ids), int(masked.size)


@dataclass(frozen=True)
class DeltaSegment:
    """A loaded delta, held in memory (it is small), with what the reader needs about the masked rows."""

    directory: str
    base: str
    chunk_ids: npt.NDArray[np.str_]
    zone_codes: npt.NDArray[np.int32]
    masked_rows: npt.NDArray[np.int64]
    masked_zone_codes: npt.NDArray[np.int32]  # the base zone code of each masked row
    vocab: dict[str, int]
    indptr: npt.NDArray[np.int64]
    indices: npt.NDArray[np.int32]
    data: npt.NDArray[np.float32]
    zone_index: dict[str, int] = field(default_factory=dict)
    zone_sizes: dict[int, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.chunk_ids)

    def postings(self, token: str) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]] | None:
        term = self.vocab.get(token)
        if term is None:
            return None
        start, end = int(self.indptr[term]), int(self.indptr[term + 1])
        return self.indices[start:end], self.data[start:end]

    def df(self, token: str, *, zone: str | None = None) -> int:
        """How many delta rows (of ``zone``, when given) contain ``token``."""
        found = self.postings(token)
        if found is None:
            return 0
        if zone is None:
            return len(found[0])
        code = self.zone_index.get(zone)
        return 0 if code is None else int(np.count_nonzero(self.zone_codes[found[0]] == code))

    def masked_df(self, docs: npt.NDArray[Any], *, base_code: int | None = None) -> int:
        """How many of the base rows ``docs`` (one term's posting list) are masked (and of zone ``base_code``)."""
        if self.masked_rows.size == 0 or docs.size == 0:
            return 0
        at = np.minimum(np.searchsorted(self.masked_rows, docs), self.masked_rows.size - 1)
        hit = self.masked_rows[at] == docs
        if base_code is not None:
            hit &= self.masked_zone_codes[at] == base_code
        return int(np.count_nonzero(hit))

    def masked_in_zone(self, base_code: int | None) -> int:
        if base_code is None:
            return 0
        return int(np.count_nonzero(self.masked_zone_codes == base_code))


def load_delta(directory: Path, *, base_zone_codes: npt.NDArray[np.int32] | None) -> DeltaSegment:
    """Load the delta in ``directory``; ``base_zone_codes`` are its base generation's (None: no base rows)."""
    try:
        meta: Any = json.loads((directory / DELTA_META_FILE).read_text(encoding="utf-8"))
        with np.load(directory / DELTA_ARRAYS_FILE, allow_pickle=False) as arrays:
            loaded = {name: arrays[name] for name in arrays.files}
        zones = [str(z) for z in meta["zones"]]
        terms = [str(t) for t in meta["terms"]]
        base = str(meta["base"])
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StoreUnavailableError(f"cannot read BM25 delta {directory}: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise PermanentError(f"BM25 delta {directory} is corrupt ({exc}); rebuild the shard's BM25 index") from exc
    masked = loaded["masked_rows"].astype(np.int64)
    if base_zone_codes is None:
        masked_codes = np.full(masked.size, -1, dtype=np.int32)
    else:
        masked_codes = base_zone_codes[masked].astype(np.int32)
    zone_codes = loaded["zone_codes"].astype(np.int32)
    counts = np.bincount(zone_codes, minlength=len(zones))
    return DeltaSegment(
        directory=directory.name,
        base=base,
        chunk_ids=loaded["chunk_ids"],
        zone_codes=zone_codes,
        masked_rows=masked,
        masked_zone_codes=masked_codes,
        vocab={t: i for i, t in enumerate(terms)},
        indptr=loaded["indptr"],
        indices=loaded["indices"],
        data=loaded["data"],
        zone_index={z: i for i, z in enumerate(zones)},
        zone_sizes={i: int(c) for i, c in enumerate(counts.tolist())},
    )
