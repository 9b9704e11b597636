"""``reconcile``: the difference between a source tree and what a zone's index holds, and the events that
publish exactly it (each winning over the stored seq)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.admin.reconcile import (
    IndexedDocument,
    Planned,
    Stage,
    in_scope,
    next_seq,
    plan,
    reconcile,
    tree_prefix,
)
from shardfuse.pipeline.core.errors import InvalidEventError
from shardfuse.pipeline.core.events import MAX_BIGINT, Op, WriteEvent
from shardfuse.pipeline.storage.cas import InMemoryContentStore, hash_content

H1, H2 = hash_content(b"one"), hash_content(b"two")


def doc(path: str, content_hash: str | None = H1, seq: int = 10, status: str = "indexed") -> IndexedDocument:
    return IndexedDocument(path, content_hash, seq, status)


# (tree, index, expected writes, expected deletes, unchanged, tombstones)
CASES = {
    "in step": ({"d/a": H1}, [doc("d/a")], [], [], 1, 0),
    "new file": ({"d/a": H1, "d/b": H2}, [doc("d/a")], [Planned("d/b", -1)], [], 1, 0),
    "content changed (its last event lost in flight)": ({"d/a": H2}, [doc("d/a", seq=7)], [Planned("d/a", 7)],
                                                        [], 0, 0),
    "file gone": ({}, [doc("d/a", seq=9)], [], [Planned("d/a", 9)], 0, 0),
    "skipped document gone": ({}, [doc("d/a", status="skipped")], [], [Planned("d/a", 10)], 0, 0),
    "skipped document unchanged": ({"d/a": H1}, [doc("d/a", status="skipped")], [], [], 1, 0),
    "tombstone, file still gone": ({}, [doc("d/a", None, 12, "deleted")], [], [], 0, 1),
    "tombstone, file back": ({"d/a": H1}, [doc("d/a", None, 12, "deleted")], [Planned("d/a", 12)], [], 0, 0),
    "tombstone, same content back": ({"d/a": H1}, [doc("d/a", H1, 12, "deleted")], [Planned("d/a", 12)], [], 0, 0),
    "outside the tree: untouched": ({"d/a": H1}, [doc("d/a"), doc("other/x"), doc("dx/y")], [], [], 1, 0),
    "empty index": ({"d/a": H1, "d/b": H1}, [], [Planned("d/a", -1), Planned("d/b", -1)], [], 0, 0),
}


@pytest.mark.parametrize(("tree", "index", "writes", "deletes", "unchanged", "tombstones"), CASES.values(),
                         ids=CASES.keys())
def test_plan_is_exactly_the_difference(tree: dict[str, str], index: list[IndexedDocument],
                                        writes: list[Planned], deletes: list[Planned], unchanged: int,
                                        tombstones: int) -> None:
    diff = plan(tree, index, prefix="d/")
    assert (list(diff.writes), list(diff.deletes), diff.unchanged, diff.tombstones) == (
        writes, deletes, unchanged, tombstones)
    assert diff.compared == sum(1 for d in index if d.path.startswith("d/"))


def test_plan_leaves_unreadable_files_alone_rather_than_deleting_them() -> None:
    diff = plan({"d/b": H1}, [doc("d/a"), doc("d/b", H2)], prefix="d/", leave={"d/a", "d/b"})
    assert (diff.writes, diff.deletes, diff.compared) == ((), (), 0)


def test_plan_cannot_supersede_the_largest_seq_and_says_so() -> None:
    diff = plan({"d/a": H2}, [doc("d/a", seq=MAX_BIGINT), doc("d/b", seq=MAX_BIGINT)], prefix="d/")
    assert (diff.writes, diff.deletes, diff.stuck) == ((), (), ("d/a", "d/b"))


@pytest.mark.parametrize(("path", "prefix", "inside"), [
    ("docs/a.md", "docs/", True), ("docsx/a.md", "docs/", False), ("docs", "docs/", False),
    ("a.md", "", True), ("sub/a.md", "", True), ("/abs/a.md", "", False), ("/abs/a.md", "/abs/", True),
])
def test_scope_is_the_tree_s_names(path: str, prefix: str, inside: bool) -> None:
    assert in_scope(path, prefix) is inside


@pytest.mark.parametrize(("name", "prefix"), [(".", ""), ("docs", "docs/"), ("a/b", "a/b/"), ("/t/x", "/t/x/")])
def test_tree_prefix(name: str, prefix: str) -> None:
    assert tree_prefix(name) == prefix


@pytest.mark.parametrize(("after", "now", "seq"), [(-1, 100, 100), (50, 100, 100), (100, 100, 101), (500, 100, 501)])
def test_next_seq_always_wins_over_the_stored_one(after: int, now: int, seq: int) -> None:
    assert next_seq(after, now) == seq


# -- property: applying the plan's events under the version rule makes the index equal the tree ------------
def _apply(index: dict[str, IndexedDocument], events: list[WriteEvent]) -> None:
    for event in events:  # the shards' version rule: newer seq wins; deletes leave a tombstone
        held = index.get(event.path)
        if held is None or event.seq > held.seq:
            status = "indexed" if event.op is Op.WRITE else "deleted"
            index[event.path] = IndexedDocument(event.path, event.content_hash, event.seq, status)


paths = st.sampled_from([f"d/{c}" for c in "abcdef"])
contents = st.sampled_from([b"one", b"two", b"three"])


@settings(max_examples=150, deadline=None)
@given(tree=st.dictionaries(paths, contents),
       index=st.dictionaries(paths, st.tuples(contents, st.integers(0, 2**40), st.sampled_from(
           ["indexed", "skipped", "deleted"]))),
       clock=st.integers(0, 2**40))
def test_after_reconcile_the_index_equals_the_tree(tmp_path_factory: pytest.TempPathFactory,
                                                   tree: dict[str, bytes],
                                                   index: dict[str, tuple[bytes, int, str]], clock: int) -> None:
    base = tmp_path_factory.mktemp("tree")
    (base / "d").mkdir()
    for path, data in tree.items():
        (base / path).write_bytes(data)
    held = {p: IndexedDocument(p, hash_content(c), seq, status) for p, (c, seq, status) in index.items()}
    held["elsewhere/x"] = doc("elsewhere/x")
    cas = InMemoryContentStore()
    sink = _ListSink()
    # A clock that may be behind every stored seq: the events must still win.
    report = reconcile(base / "d", zone="z", index=lambda prefix: list(held.values()),
                       publisher=Publisher(cas=cas, sink=sink, clock=lambda: clock), base=base,
                       clock=lambda: clock)
    assert len(sink.events) == len(report.plan.writes) + len(report.plan.deletes)
    _apply(held, sink.events)
    live = {p: d.content_hash for p, d in held.items() if d.status != "deleted"}
    assert live == {**{p: hash_content(data) for p, data in tree.items()}, "elsewhere/x": H1}
    for event in sink.events:
        if event.op is Op.WRITE:
            assert cas.get(event.content_hash or "") == tree[event.path]
    # Once applied, a second run finds nothing to do.
    again = reconcile(base / "d", zone="z", index=lambda prefix: list(held.values()), publisher=None, base=base)
    assert (again.plan.writes, again.plan.deletes) == ((), ())


class _ListSink:
    def __init__(self) -> None:
        self.events: list[WriteEvent] = []

    def send(self, event: WriteEvent) -> None:
        self.events.append(event)


# -- the walk ----------------------------------------------------------------------------------------------
def test_reconcile_walks_like_publish_and_reports_progress(tmp_path: Path) -> None:
    (tmp_path / "src" / "build").mkdir(parents=True)
    (tmp_path / "src" / ".gitignore").write_text("build/\n")
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / "src" / "build" / "gen.py").write_text("generated\n")
    seen: dict[Stage, int] = {}
    index = [doc("src/a.py", hash_content(b"a = 1\n")), doc("src/build/gen.py"), doc("src/old.py")]
    sink = _ListSink()
    report = reconcile(tmp_path / "src", zone="z", index=lambda prefix: [d for d in index if in_scope(d.path, prefix)],
                       publisher=Publisher(cas=InMemoryContentStore(), sink=sink), base=tmp_path,
                       progress=lambda stage, n: seen.__setitem__(stage, n))
    # the ignored file is not in the tree: its document goes, as publish would never have published it
    assert [(e.op, e.path) for e in sink.events] == [(Op.WRITE, "src/.gitignore"), (Op.DELETE, "src/build/gen.py"),
                                                     (Op.DELETE, "src/old.py")]
    assert seen == {Stage.WALK: 2, Stage.COMPARE: 3, Stage.PUBLISH: 3}
    assert (report.walked, report.plan.unchanged, report.tree.prefix) == (2, 1, "src/")


def test_a_file_no_event_can_name_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    os.close(os.open(os.path.join(os.fsencode(tmp_path), b"d", b"bad-\xff.txt"), os.O_CREAT | os.O_WRONLY))
    (tmp_path / "d" / "ok.txt").write_text("ok")
    sink = _ListSink()
    report = reconcile(tmp_path / "d", zone="z", index=lambda prefix: [], base=tmp_path,
                       publisher=Publisher(cas=InMemoryContentStore(), sink=sink))
    assert [e.path for e in sink.events] == ["d/ok.txt"]
    assert list(report.tree.unreadable) == ["d/bad-\udcff.txt"]


def test_a_bad_zone_or_a_file_instead_of_a_directory_is_refused_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(InvalidEventError):
        reconcile(tmp_path, zone="bad zone!", index=lambda prefix: [], publisher=None, base=tmp_path)
    with pytest.raises(NotADirectoryError):
        reconcile(tmp_path / "f.txt", zone="z", index=lambda prefix: [], publisher=None, base=tmp_path)


def test_dry_run_publishes_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    report = reconcile(tmp_path, zone="z", index=lambda prefix: [doc("gone.txt")], publisher=None, base=tmp_path)
    assert ([p.path for p in report.plan.writes], [p.path for p in report.plan.deletes]) == (["a.txt"], ["gone.txt"])
    assert report.events == ()


def test_a_planned_write_whose_file_vanished_after_the_walk_is_reported_and_the_rest_published(
        tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / "d" / name).write_text(name)

    def index_after_b_vanished(prefix: str) -> list[IndexedDocument]:  # read once the tree has been walked
        (tmp_path / "d" / "b.txt").unlink()
        return []

    sink = _ListSink()
    report = reconcile(tmp_path / "d", zone="z", index=index_after_b_vanished, base=tmp_path,
                       publisher=Publisher(cas=InMemoryContentStore(), sink=sink))
    assert [e.path for e in sink.events] == ["d/a.txt", "d/c.txt"]
    assert dict(report.not_published) == {"d/b.txt": "No such file or directory"}
