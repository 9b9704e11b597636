"""On start the watcher catches up by reconciling each tree with the index, and starts from a ledger that
holds exactly what the index will hold once those events apply."""

from __future__ import annotations

from pathlib import Path

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.admin.reconcile import IndexedDocument
from shardfuse.pipeline.admin.watching.catch_up import catch_up, root_names
from shardfuse.pipeline.admin.watching.resolution import SourceTrees
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.storage.cas import InMemoryContentStore, hash_content


class ListSink:
    def __init__(self) -> None:
        self.events: list[WriteEvent] = []

    def send(self, event: WriteEvent) -> None:
        self.events.append(event)


def test_catch_up_publishes_the_offline_changes_and_fills_the_ledger(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "same.md").write_text("same")
    (root / "changed.md").write_text("new")
    (root / "sub" / "added.md").write_text("added")
    (root / "back.md").write_text("back")
    held = [IndexedDocument("docs/same.md", hash_content(b"same"), 10, "indexed"),
            IndexedDocument("docs/changed.md", hash_content(b"old"), 11, "indexed"),
            IndexedDocument("docs/removed.md", hash_content(b"r"), 12, "indexed"),
            IndexedDocument("docs/back.md", None, 2**62, "deleted"),  # a tombstone with a seq ahead of the clock
            IndexedDocument("other/x.md", hash_content(b"x"), 13, "indexed")]  # outside the tree
    asked: list[str] = []

    def index(prefix: str) -> list[IndexedDocument]:
        asked.append(prefix)
        return [d for d in held if d.path.startswith(prefix)]

    sink = ListSink()
    trees = SourceTrees([root, root / "sub"], base=tmp_path)  # a directory inside another is watched once
    ledger, reports = catch_up(trees, zone="z", index=index, publisher=Publisher(cas=InMemoryContentStore(),
                                                                                   sink=sink))
    assert asked == ["docs/"] and len(reports) == 1 and root_names(trees) == ["docs"]
    assert sorted((e.op.value, e.path) for e in sink.events) == [
        ("delete", "docs/removed.md"), ("write", "docs/back.md"), ("write", "docs/changed.md"),
        ("write", "docs/sub/added.md")]
    assert ledger.live == {"docs/same.md": hash_content(b"same"), "docs/changed.md": hash_content(b"new"),
                           "docs/sub/added.md": hash_content(b"added"), "docs/back.md": hash_content(b"back")}
    back = next(e for e in sink.events if e.path == "docs/back.md" and e.op is Op.WRITE)
    assert back.seq == 2**62 + 1 and ledger.seq_for("docs/back.md", 5) == 2**62 + 2
