"""The shard manifest: which generation of a shard's BM25 index is published.

Publishing a generation is one atomic ``os.replace`` of ``MANIFEST.json``, so a reader sees the old or the
new manifest and never a half-written one. A manifest that fails to parse is therefore not a torn write
that a retry would get past: it is damaged (or written by an incompatible version), and the same bytes come
back on every read until a rebuild replaces it. That is why it raises :class:`PermanentError`, with the fix
in the message, while an I/O failure reaching the file (e.g. the shared filesystem is away) raises
:class:`StoreUnavailableError`, which the Celery layer retries.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shardfuse.pipeline.core.durable_files import atomic_write_bytes
from shardfuse.pipeline.core.errors import PermanentError, StoreUnavailableError
from shardfuse.pipeline.index.lexical.layout import MANIFEST_TMP_PREFIX, manifest_path, shard_dir

# Bumped when the on-disk layout of a generation changes incompatibly.
MANIFEST_FORMAT = 1


@dataclass(frozen=True, slots=True)
class ShardManifest:
    """One published generation of a shard's BM25 index.

    ``built_version`` is an increasing number chosen by the caller of the build (the xmax of the PostgreSQL
    snapshot the build read its chunks at, :attr:`built_snapshot`): a build never replaces one published
    at a higher version. ``doc_count`` counts every chunk, including chunks whose
    text has no tokens; ``vocab_size`` counts distinct terms, and is 0 when no bm25s files were written
    (an empty shard, or no chunk has a token).
    """

    shard: int
    generation: int
    built_version: int
    doc_count: int
    directory: str
    created_at: float
    k1: float
    b: float
    vocab_size: int = 0
    # Manifests written before the field existed were built by the first, simple tokenizer.
    tokenizer: str = "simple-v1"
    # The delta segment over the generation (``delta.py``), "" when none. ``built_version`` then covers the
    # delta too; ``base_version`` is what the generation alone covers (-1 in a manifest written before
    # deltas existed: the same as built_version).
    base_version: int = -1
    delta: str = ""
    delta_docs: int = 0
    delta_masked: int = 0
    delta_created_at: float = 0.0
    # Where the versions come from: the PostgreSQL snapshot (``xmin:xmax:xip``) the index — generation and
    # delta — was read at (:mod:`shardfuse.pipeline.index.store.change_log`); ``built_version`` is then that
    # snapshot's xmax. "" in a manifest written when versions were a Redis counter: that counter could go
    # backwards and hide documents, so such a manifest is never trusted for a delta (the update merges).
    built_snapshot: str = ""

    @property
    def tracks_postgres(self) -> bool:
        """Whether the shard's changes since this index can be asked of PostgreSQL (:attr:`built_snapshot`)."""
        return bool(self.built_snapshot)

    @property
    def identity(self) -> str:
        """What is published, in one string that changes with every publish: a new generation (numbers
        restart after a shard's folder is lost, so its build time too) or a new delta over it."""
        return (f"{self.generation}@{self.created_at!r}:{self.built_version}:{self.delta}"
                f"@{self.delta_created_at!r}")

    @property
    def generation_version(self) -> int:
        """The version the generation (without its delta) covers."""
        return self.built_version if self.base_version < 0 else self.base_version

    def to_json(self) -> str:
        """Serialise to JSON (with a format number, checked by :meth:`from_json`)."""
        return json.dumps({"format": MANIFEST_FORMAT, **asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ShardManifest:
        """Parse :meth:`to_json` output; raise ``ValueError`` when it is not a valid manifest."""
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("manifest is not a JSON object")
        fmt = data.pop("format", None)
        if fmt != MANIFEST_FORMAT:
            raise ValueError(f"manifest format {fmt!r} is not {MANIFEST_FORMAT}")
        try:
            manifest = cls(
                shard=_int(data["shard"]),
                generation=_int(data["generation"]),
                built_version=_int(data["built_version"]),
                doc_count=_int(data["doc_count"]),
                directory=_str(data["directory"]),
                created_at=_float(data["created_at"]),
                k1=_float(data["k1"]),
                b=_float(data["b"]),
                vocab_size=_int(data["vocab_size"]),
                tokenizer=_str(data["tokenizer"]),
                base_version=_int(data.get("base_version", -1)),
                delta=_str(data.get("delta", "")),
                delta_docs=_int(data.get("delta_docs", 0)),
                delta_masked=_int(data.get("delta_masked", 0)),
                delta_created_at=_float(data.get("delta_created_at", 0.0)),
                built_snapshot=_str(data.get("built_snapshot", "")),
            )
        except KeyError as exc:
            raise ValueError(f"manifest lacks field {exc}") from exc
        # A directory name with a separator could make a reader load files outside the shard.
        if "/" in manifest.directory or manifest.directory in ("", ".", ".."):
            raise ValueError(f"manifest directory {manifest.directory!r} is not a plain name")
        if "/" in manifest.delta or manifest.delta in (".", ".."):
            raise ValueError(f"manifest delta {manifest.delta!r} is not a plain name")
        return manifest


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def read_manifest(root: Path, shard: int) -> ShardManifest | None:
    """The published manifest of ``shard`` under ``root``, or None when nothing has been built yet.

    Raises :class:`StoreUnavailableError` when the file cannot be read and :class:`PermanentError` when it
    is not a valid manifest (see the module docstring for why).
    """
    found = read_manifest_text(root, shard)
    return None if found is None else found[1]


def read_manifest_text(root: Path, shard: int, *,
                       last: tuple[str, ShardManifest] | None = None) -> tuple[str, ShardManifest] | None:
    """:func:`read_manifest`, with the file's text; ``last``'s manifest when the text is ``last``'s (a follower
    reads the file ten times a second, and it rarely changes)."""
    path = manifest_path(root, shard)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreUnavailableError(f"cannot read BM25 manifest {path}: {exc}") from exc
    if last is not None and last[0] == text:
        return last
    try:
        manifest = ShardManifest.from_json(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PermanentError(
            f"BM25 manifest {path} is corrupt ({exc}); rebuild shard {shard}'s BM25 index to replace it"
        ) from exc
    if manifest.shard != shard:
        raise PermanentError(
            f"BM25 manifest {path} names shard {manifest.shard}, not {shard}; "
            f"check the BM25 root directory and rebuild shard {shard}"
        )
    return text, manifest


def write_manifest(root: Path, manifest: ShardManifest) -> None:
    """Publish ``manifest`` atomically (tmp file + fsync + ``os.replace`` + directory fsync).

    Callers serialise concurrent publishers with the shard lock; the write itself is safe for readers
    without any lock.
    """
    path = manifest_path(root, manifest.shard)
    shard_dir(root, manifest.shard).mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, manifest.to_json().encode("utf-8"), tmp_prefix=MANIFEST_TMP_PREFIX)
