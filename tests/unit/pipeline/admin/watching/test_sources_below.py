"""``walk_skips`` and ``iter_files_below`` (the watcher's look at one path or one directory) agree with the
walk of ``shardfuse publish`` (``iter_source_files``) on every path of a tree with nested ``.gitignore``
files, negations, ignored directories, a symlink and a ``.git`` folder."""

from __future__ import annotations

import os
from pathlib import Path

from shardfuse.pipeline.admin.sources import document_name, iter_files_below, iter_source_files, walk_skips

FILES = {
    ".gitignore": "*.log\n/build/\n",  # above the watched root: applies to it (base = tmp_path)
    "proj/.gitignore": "secret*\n!secret.keep\ncache/\n",
    "proj/a.md": "", "proj/run.log": "", "proj/secret.txt": "", "proj/secret.keep": "",
    "proj/build/x.md": "",  # /build/ is anchored at tmp_path: proj/build is not ignored
    "proj/cache/c.md": "", "proj/sub/cache/c.md": "",
    "proj/sub/.gitignore": "!*.log\n",  # a deeper negation wins
    "proj/sub/kept.log": "", "proj/sub/b.md": "",
    "proj/.git/HEAD": "", "proj/sub/.git/config": "",
}


def _tree(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    os.symlink(tmp_path / "proj" / "a.md", tmp_path / "proj" / "link.md")
    return tmp_path / "proj"


def test_walk_skips_agrees_with_the_publish_walk_on_every_path(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    published = {f.path for f in iter_source_files([root], base=tmp_path)}
    assert {p.relative_to(root).as_posix() for p in published} == {
        ".gitignore", "a.md", "secret.keep", "build/x.md", "sub/.gitignore", "sub/kept.log", "sub/b.md"}
    everything = [Path(d) / n for d, dirs, files in os.walk(root) for n in [*dirs, *files]]
    for path in everything:
        if path.is_file() and not path.is_symlink():
            assert walk_skips(path, root=root, base=tmp_path) == (path not in published), path
    assert walk_skips(root / "link.md", root=root, base=tmp_path)
    assert not walk_skips(root, root=root, base=tmp_path)
    assert walk_skips(root / "gone.md", root=root, base=tmp_path)


def test_iter_files_below_yields_what_the_publish_walk_yields_under_each_directory(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    published = {(f.path, f.name) for f in iter_source_files([root], base=tmp_path)}
    directories = [root, *(Path(d) / n for d, dirs, _ in os.walk(root) for n in dirs)]
    for directory in directories:
        below = {(f.path, f.name) for f in iter_files_below(directory, root=root, base=tmp_path)}
        assert below == {(p, n) for p, n in published if directory in p.parents}, directory
    assert document_name(root / "sub" / "b.md", base=tmp_path) == "proj/sub/b.md"
