from __future__ import annotations

from pathlib import Path

import pytest

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.admin.sources import iter_source_files
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.storage.cas import InMemoryContentStore


class ListSink:
    def __init__(self, cas: InMemoryContentStore) -> None:
        self.events: list[WriteEvent] = []
        self.cas = cas

    def send(self, event: WriteEvent) -> None:
        # the content must already be in the CAS when the event is published
        if event.op is Op.WRITE:
            assert event.content_hash is not None and self.cas.exists(event.content_hash)
        self.events.append(event)


def test_write_stores_content_first_then_publishes_a_valid_event() -> None:
    cas = InMemoryContentStore()
    sink = ListSink(cas)
    clock = iter([100, 200]).__next__
    publisher = Publisher(cas=cas, sink=sink, clock=clock)
    event = publisher.write(zone="z", path="src/app.py", data=b"print('hi')\n", metadata={"team": "x"})
    assert cas.get(event.content_hash or "") == b"print('hi')\n"
    assert (event.size, event.seq, event.mime, event.metadata) == (12, 100, "text/x-python", {"team": "x"})
    deleted = publisher.delete(zone="z", path="src/app.py")
    assert deleted.op is Op.DELETE and deleted.seq == 200
    assert sink.events == [event, deleted]
    assert publisher.write(zone="z", path="p", data=b"x", seq=5).seq == 5


def _names(tmp_path: Path, *roots: Path) -> list[str]:
    return [f.name for f in iter_source_files(list(roots), base=tmp_path)]


def test_walk_honours_nested_gitignore_files_like_git(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.log\nbuild/\n")
    (tmp_path / "src" / "gen").mkdir(parents=True)
    (tmp_path / "src" / ".gitignore").write_text("gen/\n!important.log\n")
    (tmp_path / "build").mkdir()
    (tmp_path / ".git").mkdir()
    for rel in ["a.py", "x.log", "build/out.py", ".git/config", "src/b.py", "src/gen/c.py",
                "src/important.log", "src/other.log"]:
        (tmp_path / rel).write_text("x")
    assert _names(tmp_path, tmp_path) == [".gitignore", "a.py", "src/.gitignore", "src/b.py", "src/important.log"]
    # publishing a subdirectory still applies the .gitignore files above it
    assert _names(tmp_path, tmp_path / "src") == ["src/.gitignore", "src/b.py", "src/important.log"]
    # a file named explicitly is published even if ignored
    assert _names(tmp_path, tmp_path / "x.log") == ["x.log"]


def test_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _names(tmp_path, tmp_path / "nope")
