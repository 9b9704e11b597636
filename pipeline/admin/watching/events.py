"""File system events as the watcher sees them (plain data; the watchdog adapter builds them), and the paths
each one asks the watcher to look at again."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

GITIGNORE = ".gitignore"


class Kind(enum.StrEnum):
    CREATED = "created"
    MODIFIED = "modified"  # content written (or, for a file, its attributes changed: readable again?)
    CLOSED = "closed"  # closed after writing
    DELETED = "deleted"
    MOVED = "moved"  # ``path`` → ``dest``


@dataclass(frozen=True, slots=True)
class FsEvent:
    kind: Kind
    path: Path  # absolute
    is_directory: bool = False
    dest: Path | None = None  # MOVED only: where it went


@dataclass(frozen=True, slots=True)
class Touched:
    """A path whose state on disk must be looked at again; ``is_directory``: it is (or was) a directory, so
    what the index holds under it is looked at too."""

    path: Path
    is_directory: bool = False


def touched(event: FsEvent) -> tuple[Touched, ...]:
    """The paths ``event`` may have changed.

    A rename touches both ends (the old name is then missing: a delete; the new one present: a write); a
    directory created, deleted or renamed touches everything under it. A directory's own "modified" event
    (inotify reports one for every entry added or removed) says nothing its entries' events do not, and a
    ``.gitignore`` written changes what is published from its whole directory.
    """
    if event.is_directory and event.kind in (Kind.MODIFIED, Kind.CLOSED):
        return ()
    ends = [event.path] if event.dest is None else [event.path, event.dest]
    found = [Touched(end, event.is_directory) for end in ends]
    for end in ends:
        if not event.is_directory and end.name == GITIGNORE:
            found.append(Touched(end.parent, is_directory=True))
    return tuple(found)
