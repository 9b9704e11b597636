"""Which paths an event makes the watcher look at again."""

from __future__ import annotations

from pathlib import Path

from shardfuse.pipeline.admin.watching.events import FsEvent, Kind, Touched, touched

W = Path("/w")


def test_a_rename_touches_both_ends() -> None:
    assert touched(FsEvent(Kind.MOVED, W / "a.md", dest=W / "b.md")) == (Touched(W / "a.md"), Touched(W / "b.md"))


def test_a_directory_rename_or_delete_touches_the_directories() -> None:
    moved = FsEvent(Kind.MOVED, W / "old", is_directory=True, dest=W / "new")
    assert touched(moved) == (Touched(W / "old", True), Touched(W / "new", True))
    assert touched(FsEvent(Kind.DELETED, W / "gone", is_directory=True)) == (Touched(W / "gone", True),)


def test_a_directory_modified_says_nothing_its_entries_do_not() -> None:
    assert touched(FsEvent(Kind.MODIFIED, W / "d", is_directory=True)) == ()


def test_a_gitignore_written_touches_its_whole_directory() -> None:
    assert touched(FsEvent(Kind.CLOSED, W / "d" / ".gitignore")) == (
        Touched(W / "d" / ".gitignore"), Touched(W / "d", True))
