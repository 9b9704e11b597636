"""The watcher over a real tree: what each editing pattern publishes, judged by what is on disk once the
paths settle, with the same names and ``.gitignore`` rules as ``shardfuse publish``."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from shardfuse.pipeline.admin.reconcile import IndexedDocument
from shardfuse.pipeline.admin.sources import iter_source_files
from shardfuse.pipeline.admin.watching.events import Kind, Touched
from shardfuse.pipeline.admin.watching.ledger import Ledger
from shardfuse.pipeline.admin.watching.resolution import Resolution
from shardfuse.pipeline.core.errors import ConfigurationError, PermanentError, StoreUnavailableError
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.storage.cas import InMemoryContentStore, hash_content
from shardfuse.pipeline.storage.streams import Stored
from tests.unit.pipeline.admin.watching.harness import SETTLE_S, Harness


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def test_create_then_modify_publishes_one_write_each_and_a_touch_nothing(h: Harness) -> None:
    h.write("a.md", "first")
    h.write("a.md", "first, then more")  # in the same burst: one write of the final content
    assert h.settle() == [("write", "docs/a.md")]
    assert h.sink.published[-1].content_hash == hash_content(b"first, then more")
    h.event(Kind.MODIFIED, "a.md")  # touched, content unchanged
    assert h.settle() == []
    h.write("a.md", "second")
    assert h.settle() == [("write", "docs/a.md")]


def test_nothing_is_published_before_the_path_is_quiet(h: Harness) -> None:
    h.write("a.md", "x")
    h.now += SETTLE_S / 2
    assert h.watcher.publish_due() is None and h.watcher.pending == 1


def test_save_by_rename_is_one_write_of_the_target_never_a_delete(h: Harness) -> None:
    h.write("a.md", "v1")
    h.settle()
    # The temp file is written, then renamed over the target (most editors, atomic writers).
    h.write(".a.md.tmp123", "v2")
    h.path(".a.md.tmp123").replace(h.path("a.md"))
    h.event(Kind.MOVED, ".a.md.tmp123", "a.md")
    assert h.settle() == [("write", "docs/a.md")]
    assert h.sink.published[-1].content_hash == hash_content(b"v2")


def test_vims_backup_rename_is_one_write_of_the_target(h: Harness) -> None:
    h.write("a.md", "v1")
    h.settle()
    h.path("a.md").rename(h.path("a.md~"))  # target → target~
    h.event(Kind.MOVED, "a.md", "a.md~")
    h.write("a.md", "v2")  # the new target
    h.path("a.md~").unlink()  # the backup goes
    h.event(Kind.DELETED, "a.md~")
    assert h.settle() == [("write", "docs/a.md")]


def test_a_rename_is_a_delete_of_the_old_path_and_a_write_of_the_new(h: Harness) -> None:
    h.write("a.md", "x")
    h.settle()
    h.path("a.md").rename(h.path("b.md"))
    h.event(Kind.MOVED, "a.md", "b.md")
    assert h.settle() == [("write", "docs/b.md"), ("delete", "docs/a.md")]


def test_a_directory_rename_or_delete_covers_the_files_under_it(h: Harness) -> None:
    for rel in ("sub/x.md", "sub/deeper/y.md"):
        h.write(rel, rel)
    assert len(h.settle()) == 2
    h.path("sub").rename(h.path("moved"))
    h.event(Kind.MOVED, "sub", "moved", is_directory=True)  # no event for the files themselves
    assert h.settle() == [("write", "docs/moved/deeper/y.md"), ("write", "docs/moved/x.md"),
                          ("delete", "docs/sub/deeper/y.md"), ("delete", "docs/sub/x.md")]
    shutil.rmtree(h.path("moved"))
    h.event(Kind.DELETED, "moved", is_directory=True)
    assert h.settle() == [("delete", "docs/moved/deeper/y.md"), ("delete", "docs/moved/x.md")]


def test_gitignore_is_honoured_as_publish_does_and_a_new_rule_deletes_what_it_now_ignores(h: Harness) -> None:
    h.write(".gitignore", "*.log\nbuild/\n")
    h.write("keep.md", "k")
    h.write("debug.log", "noise")
    h.write("build/out.md", "generated")
    h.write("notes.tmp", "t")
    h.write(".git/index", "git's own")
    published = h.settle()
    expected = sorted(f.name for f in iter_source_files([h.root], base=h.base))
    assert sorted(path for _, path in published) == expected == ["docs/.gitignore", "docs/keep.md", "docs/notes.tmp"]
    h.write(".gitignore", "*.log\nbuild/\n*.tmp\n")  # notes.tmp is ignored from now on
    assert h.settle() == [("write", "docs/.gitignore"), ("delete", "docs/notes.tmp")]


def test_a_broker_outage_keeps_every_pending_change_and_sends_nothing_twice(h: Harness) -> None:
    h.write("a.md", "v1")
    h.write("b.md", "b")
    h.sink.outage = True
    h.now += 10 * SETTLE_S
    with pytest.raises(StoreUnavailableError):
        h.watcher.publish_due()
    assert h.watcher.pending == 2 and len(h.sink.held) == 2  # made once, held by the sink
    with pytest.raises(StoreUnavailableError):
        h.watcher.publish_due()
    assert len(h.sink.held) == 2  # a second try made no new events
    h.write("a.md", "v2")  # changed again during the outage
    h.path("b.md").unlink()
    h.event(Kind.DELETED, "b.md")
    h.sink.outage = False
    assert h.settle() == [("write", "docs/a.md"), ("write", "docs/b.md"), ("write", "docs/a.md"),
                          ("delete", "docs/b.md")]
    latest = {e.path: e for e in sorted(h.sink.published, key=lambda e: e.seq)}  # the newest seq wins
    assert latest["docs/a.md"].content_hash == hash_content(b"v2")
    assert latest["docs/b.md"].content_hash is None and h.watcher.pending == 0


def test_a_failure_while_sending_puts_the_paths_back_and_keeps_what_was_sent(h: Harness) -> None:
    h.write("a.md", "a")
    h.write("b.md", "b")
    sent = h.sink.send
    calls = {"n": 0}

    def second_send_fails(event: WriteEvent) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise StoreUnavailableError("cannot publish to the broker: connection refused")
        sent(event)

    h.sink.send = second_send_fails  # type: ignore[method-assign]
    h.now += 10 * SETTLE_S
    with pytest.raises(StoreUnavailableError):
        h.watcher.publish_due()
    assert [e.path for e in h.sink.held] == ["docs/a.md"]
    # a.md was sent (the ledger knows): resolving again sends only b.md.
    assert h.settle() == [("write", "docs/a.md"), ("write", "docs/b.md")]
    assert [e.path for e in h.sink.published] == ["docs/a.md", "docs/b.md"]


def test_events_outside_the_watched_tree_are_ignored(h: Harness, tmp_path: Path) -> None:
    (tmp_path / "elsewhere.md").write_text("x")
    h.event(Kind.CREATED, "../elsewhere.md")
    assert h.settle() == []


def test_seqs_exceed_what_the_index_holds_even_when_the_clock_is_behind(tmp_path: Path) -> None:
    ledger = Ledger()
    ledger.held([IndexedDocument("docs/a.md", hash_content(b"old"), 5_000_000, "indexed")])
    h = Harness(tmp_path, ledger=ledger)
    h.write("a.md", "new")
    assert h.settle() == [("write", "docs/a.md")]
    assert h.sink.published[-1].seq == 5_000_001
    h.path("a.md").unlink()
    h.event(Kind.DELETED, "a.md")
    assert h.settle() == [("delete", "docs/a.md")] and h.sink.published[-1].seq == 5_000_002


def test_the_summary_line_counts_and_names_a_small_batch(h: Harness) -> None:
    for name in ("a.md", "b.md", "c.md", "d.md"):
        h.write(name, name)
    h.settle()
    for name in ("a.md", "b.md", "c.md"):
        h.write(name, name + "!")
    h.path("d.md").unlink()
    h.event(Kind.DELETED, "d.md")
    h.now += 10 * SETTLE_S
    batch = h.watcher.publish_due()
    assert batch is not None
    assert batch.summary() == "published 3 writes, 1 delete: docs/a.md, docs/b.md, docs/c.md, -docs/d.md"


def _after_resolving(h: Harness, then: Callable[[], None]) -> None:
    """Run ``then`` between the watcher's look at the disk and its publishing of what it saw."""
    resolve = h.watcher.trees.resolve

    def resolve_then(items: Sequence[Touched], ledger: Ledger) -> Resolution:
        resolution = resolve(items, ledger)
        then()
        return resolution

    h.watcher.trees.resolve = resolve_then  # type: ignore[method-assign]


def test_a_file_rewritten_after_it_was_resolved_is_published_as_stored(h: Harness) -> None:
    h.write("a.md", "old")
    _after_resolving(h, lambda: h.path("a.md").write_text("newer"))
    assert h.settle() == [("write", "docs/a.md")]
    event = h.sink.published[-1]
    assert (event.content_hash, event.size) == (hash_content(b"newer"), 5)  # the bytes stored, not those hashed
    assert h.watcher.ledger.hash_of("docs/a.md") == hash_content(b"newer")


def test_a_file_gone_after_it_was_resolved_is_neither_published_nor_reported(h: Harness) -> None:
    h.write("a.md", "x")
    _after_resolving(h, h.path("a.md").unlink)
    h.now += 10 * SETTLE_S
    batch = h.watcher.publish_due()
    assert batch is not None and batch.events == [] and batch.not_published == {}  # its delete event follows


class _RefusingStore(InMemoryContentStore):
    def __init__(self, refusal: Exception) -> None:
        super().__init__()
        self.refusal = refusal

    def put_file(self, path: Path) -> Stored:
        raise self.refusal


def test_a_file_that_changed_while_it_was_stored_is_reported_and_the_watch_goes_on(tmp_path: Path) -> None:
    h = Harness(tmp_path, cas=_RefusingStore(PermanentError("docs/a.md changed while it was being stored")))
    h.write("a.md", "x")
    h.now += 10 * SETTLE_S
    batch = h.watcher.publish_due()
    assert batch is not None and batch.events == []
    assert batch.not_published == {"docs/a.md": "docs/a.md changed while it was being stored"}


def test_a_store_refusing_the_credentials_stops_the_watch_instead_of_reporting_every_file(tmp_path: Path) -> None:
    h = Harness(tmp_path, cas=_RefusingStore(ConfigurationError("the S3 endpoint refused the credentials")))
    h.write("a.md", "x")
    h.now += 10 * SETTLE_S
    with pytest.raises(ConfigurationError, match="refused the credentials"):
        h.watcher.publish_due()
    assert h.sink.held == [] and h.watcher.ledger.hash_of("docs/a.md") is None
