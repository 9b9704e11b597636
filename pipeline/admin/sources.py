"""Files to publish from a local tree, skipping what ``.gitignore`` files ignore."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

ALWAYS_SKIPPED = frozenset({".git", ".hg", ".svn"})


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


def _ancestor_specs(root: Path, base: Path) -> list[tuple[Path, pathspec.GitIgnoreSpec]]:
    """The .gitignore files above ``root`` (up to ``base``, when ``root`` is under it)."""
    if root == base or base not in root.parents:
        return []
    chain = [p for p in reversed(root.parents) if p == base or base in p.parents]
    return [(d, spec) for d in chain if (spec := _spec_of(d)) is not None]


def _name(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()
