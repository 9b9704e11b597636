"""Files to publish from a local tree, skipping what ``.gitignore`` files ignore."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

ALWAYS_SKIPPED = frozenset({".git", ".hg", ".svn"})
# Parsed .gitignore files by directory (None: it has none), for the length of one look at many paths.
SpecCache = dict[Path, "pathspec.GitIgnoreSpec | None"]


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: Path  # on disk
    name: str  # the document path published: relative to the working directory when under it, POSIX


def iter_source_files(roots: Sequence[Path], *, base: Path | None = None) -> Iterator[SourceFile]:
    """Every file under ``roots`` (files are yielded as given), honouring the ``.gitignore`` of each
    directory walked and of its ancestors up to ``base``, the way git does: a pattern applies to paths
    relative to the directory holding its ``.gitignore``."""
    base = (base or Path.cwd()).resolve()
    for root in roots:
        root = root.resolve()
        if not root.exists():
            raise FileNotFoundError(f"{root} does not exist")
        if root.is_file():
            yield SourceFile(root, _name(root, base))
            continue
        specs = _ancestor_specs(root, base)
        yield from _walk(root, base, specs)


def _walk(directory: Path, base: Path, specs: list[tuple[Path, pathspec.GitIgnoreSpec]]) -> Iterator[SourceFile]:
    own = _spec_of(directory)
    if own is not None:
        specs = [*specs, (directory, own)]
    with os.scandir(directory) as entries:
        ordered = sorted(entries, key=lambda e: e.name)
    for entry in ordered:
        if entry.name in ALWAYS_SKIPPED or entry.is_symlink():
            continue
        path = Path(entry.path)
        is_dir = entry.is_dir()
        if _ignored(path, is_dir, specs):
            continue
        if is_dir:
            yield from _walk(path, base, specs)
        elif entry.is_file():
            yield SourceFile(path, _name(path, base))


def walk_skips(path: Path, *, root: Path, base: Path | None = None, cache: SpecCache | None = None) -> bool:
    """Whether walking ``root`` (:func:`iter_source_files`) would pass over ``path``, a file or directory under
    it as it is now: a directory on the way or ``path`` itself is ignored, always skipped or a symlink, or
    ``path`` is no longer there. ``root`` itself is never skipped. ``cache``: the ``.gitignore`` files read,
    kept for the next call (while they cannot have changed)."""
    root, base = root.resolve(), (base or Path.cwd()).resolve()
    specs = _specs_above(path, root, base, {} if cache is None else cache)
    if specs is None:
        return True
    if path == root:
        return False
    return _skipped(path, path.is_dir(), specs) or not (path.is_dir() or path.is_file())


def iter_files_below(directory: Path, *, root: Path, base: Path | None = None,
                     cache: SpecCache | None = None) -> Iterator[SourceFile]:
    """The files that walking ``root`` yields under ``directory`` (a directory under ``root``, or ``root``):
    nothing when the walk passes over the directory itself."""
    root, base = root.resolve(), (base or Path.cwd()).resolve()
    specs = _specs_above(directory, root, base, {} if cache is None else cache)
    if specs is None or (directory != root and _skipped(directory, True, specs)) or not directory.is_dir():
        return
    yield from _walk(directory, base, specs)


def document_name(path: Path, *, base: Path | None = None) -> str:
    """The document path :func:`iter_source_files` gives the file ``path`` (absolute, resolved)."""
    return _name(path, (base or Path.cwd()).resolve())


def _specs_above(path: Path, root: Path, base: Path,
                 cache: SpecCache) -> list[tuple[Path, pathspec.GitIgnoreSpec]] | None:
    """The ``.gitignore`` specs the walk of ``root`` applies to ``path`` (those of ``root``'s ancestors up to
    ``base``, then of ``root`` and each directory down to ``path``'s parent); None if the walk never gets
    there (a directory on the way is skipped)."""
    specs = _ancestor_specs(root, base, cache)
    current = root
    parts = path.relative_to(root).parts
    for depth, part in enumerate(parts):
        own = _cached_spec(current, cache)
        if own is not None:
            specs = [*specs, (current, own)]
        current = current / part
        if depth < len(parts) - 1 and (_skipped(current, True, specs) or not current.is_dir()):
            return None
    return specs


def _skipped(path: Path, is_dir: bool, specs: list[tuple[Path, pathspec.GitIgnoreSpec]]) -> bool:
    return path.name in ALWAYS_SKIPPED or path.is_symlink() or _ignored(path, is_dir, specs)


def _ignored(path: Path, is_dir: bool, specs: list[tuple[Path, pathspec.GitIgnoreSpec]]) -> bool:
    ignored = False
    # Deeper .gitignore files override shallower ones, including with "!" negations.
    for spec_dir, spec in specs:
        rel = path.relative_to(spec_dir).as_posix() + ("/" if is_dir else "")
        result = spec.check_file(rel)
        if result.include is not None:
            ignored = result.include
    return ignored


def _spec_of(directory: Path) -> pathspec.GitIgnoreSpec | None:
    gitignore = directory / ".gitignore"
    if not gitignore.is_file():
        return None
    return pathspec.GitIgnoreSpec.from_lines(gitignore.read_text(encoding="utf-8", errors="replace").splitlines())


def _cached_spec(directory: Path, cache: SpecCache) -> pathspec.GitIgnoreSpec | None:
    if directory not in cache:
        cache[directory] = _spec_of(directory)
    return cache[directory]


def _ancestor_specs(root: Path, base: Path,
                    cache: SpecCache | None = None) -> list[tuple[Path, pathspec.GitIgnoreSpec]]:
    """The .gitignore files above ``root`` (up to ``base``, when ``root`` is under it)."""
    if root == base or base not in root.parents:
        return []
    chain = [p for p in reversed(root.parents) if p == base or base in p.parents]
    cache = {} if cache is None else cache
    return [(d, spec) for d in chain if (spec := _cached_spec(d, cache)) is not None]


def _name(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()
