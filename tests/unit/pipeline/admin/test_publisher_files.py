"""Publishing a file from disk (``publish``, ``watch``): streamed into the CAS, so a file of any size costs a
few MiB of memory, and the event names exactly the bytes stored."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

import pytest

from shardfuse.pipeline.admin.publisher import Publisher, Write, why_not_published
from shardfuse.pipeline.admin.watching.events import Touched
from shardfuse.pipeline.admin.watching.ledger import Ledger
from shardfuse.pipeline.admin.watching.resolution import SourceTrees
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.storage.cas import LocalContentStore
from shardfuse.pipeline.storage.streams import Stored

MIB = 1024 * 1024


class Sent:
    def __init__(self) -> None:
        self.events: list[WriteEvent] = []

    def send(self, event: WriteEvent) -> None:
        self.events.append(event)


def big_file(path: Path, mib: int) -> str:
    """A file of ``mib`` MiB of distinct blocks; its CAS name."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for i in range(mib):
            block = i.to_bytes(4, "big") * (MIB // 4)
            out.write(block)
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def test_a_file_is_stored_in_bounded_memory_and_its_event_names_the_bytes_stored(tmp_path: Path) -> None:
    expected = big_file(tmp_path / "big.log", 48)
    cas, sink = LocalContentStore(tmp_path / "cas"), Sent()
    tracemalloc.start()
    try:
        event = Publisher(cas=cas, sink=sink).write(zone="z", path="logs/big.log", data=tmp_path / "big.log")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB, f"{peak / MIB:.1f} MiB held to publish a 48 MiB file"
    assert (event.content_hash, event.size, event.path) == (expected, 48 * MIB, "logs/big.log")
    assert sink.events == [event]
    assert hashlib.sha256(cas.get(expected)).hexdigest() == expected.removeprefix("sha256:")


def test_files_and_bytes_mix_in_write_many(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_bytes(b"# a\n")
    cas = LocalContentStore(tmp_path / "cas")
    events = Publisher(cas=cas, sink=Sent()).write_many(
        [Write(zone="z", path="a.md", data=tmp_path / "a.md"), Write(zone="z", path="b.md", data=b"# b\n")])
    assert [(e.path, cas.get(e.content_hash or ""), e.size) for e in events] == [("a.md", b"# a\n", 4),
                                                                                   ("b.md", b"# b\n", 4)]


def test_a_file_that_cannot_be_read_raises_its_own_error_and_sends_nothing(tmp_path: Path) -> None:
    sink = Sent()
    with pytest.raises(FileNotFoundError):
        Publisher(cas=LocalContentStore(tmp_path / "cas"), sink=sink).write(zone="z", path="gone.md",
                                                                            data=tmp_path / "gone.md")
    assert sink.events == []


@pytest.mark.parametrize(("data", "says"), [
    ("some text", "not str: encode text (text.encode()), or give a file as Path(name)"),
    (None, "not NoneType"),
    (12, "not int"),
])
def test_data_that_is_neither_bytes_nor_a_path_is_refused_before_anything_is_stored(
        tmp_path: Path, data: object, says: str) -> None:
    cas, sink = LocalContentStore(tmp_path / "cas"), Sent()
    with pytest.raises(TypeError, match="data must be the content as bytes, or a pathlib.Path") as refused:
        Publisher(cas=cas, sink=sink).write(zone="z", path="a.md", data=data)  # type: ignore[arg-type]
    assert str(refused.value).endswith(says)
    assert sink.events == [] and not [p for p in (tmp_path / "cas").rglob("*") if p.is_file()]
    assert Publisher(cas=cas, sink=sink).write(zone="z", path="a.md", data=bytearray(b"x")).size == 1


def test_the_watcher_hashes_a_big_file_in_bounded_memory_and_publishes_it_streamed(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    expected = big_file(root / "dump.sql", 32)
    trees, ledger = SourceTrees([root], base=tmp_path), Ledger()
    tracemalloc.start()
    try:
        resolution = trees.resolve([Touched(root / "dump.sql", False)], ledger)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB, f"{peak / MIB:.1f} MiB held to resolve a 32 MiB file"
    [change] = resolution.changes
    assert (change.name, change.file, change.content_hash) == ("src/dump.sql", root / "dump.sql", expected)


def test_write_many_passes_over_a_write_that_fails_alone_when_told_where_to_report_it(tmp_path: Path) -> None:
    for name in ("a.md", "bad", "c.md"):
        (tmp_path / name).write_bytes(name.encode())
    writes = [Write(zone="z", path=name, data=tmp_path / name) for name in ("a.md", "gone.md", "c.md")]
    writes.insert(2, Write(zone="z", path="bad\x00.md", data=tmp_path / "bad"))  # no event can carry a NUL
    publisher = Publisher(cas=LocalContentStore(tmp_path / "cas"), sink=Sent())
    reported: list[tuple[str, str]] = []
    events = publisher.write_many(writes, not_published=lambda write, exc: reported.append(
        (write.path, why_not_published(exc))))
    assert [e.path for e in events] == ["a.md", "c.md"]
    assert [path for path, _ in reported] == ["gone.md", "bad\x00.md"]
    assert reported[0][1] == "No such file or directory" and "path" in reported[1][1]
    with pytest.raises(FileNotFoundError):  # not told: the file's own error, as write() raises it
        publisher.write_many(writes)


class Misconfigured(LocalContentStore):
    def put_file(self, path: Path) -> Stored:
        raise ConfigurationError("the S3 endpoint refused the credentials")


def test_a_misconfigured_store_stops_write_many_instead_of_failing_every_write_alone(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_bytes(b"a")
    reported: list[str] = []
    with pytest.raises(ConfigurationError, match="refused the credentials"):
        Publisher(cas=Misconfigured(tmp_path / "cas"), sink=Sent()).write_many(
            [Write(zone="z", path="a.md", data=tmp_path / "a.md")] * 3,
            not_published=lambda write, exc: reported.append(write.path))
    assert reported == []


class SizeRefused(LocalContentStore):
    """A store whose ``size`` must not be needed: on S3 each call is one more HEAD request per file."""

    def size(self, content_hash: str) -> int:
        raise AssertionError(f"size({content_hash}) asked: put_file already said how many bytes it stored")


def test_a_files_size_comes_from_what_put_file_stored_not_another_request(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_bytes(b"# a\n" * 10)
    cas = SizeRefused(tmp_path / "cas")
    publisher = Publisher(cas=cas, sink=Sent())
    for _ in range(2):  # the second time the content is held already
        event = publisher.write(zone="z", path="a.md", data=tmp_path / "a.md")
        assert (event.content_hash, event.size) == ("sha256:" + hashlib.sha256(b"# a\n" * 10).hexdigest(), 40)
    [again] = publisher.write_many([Write(zone="z", path="a.md", data=tmp_path / "a.md")])
    assert again.size == 40
