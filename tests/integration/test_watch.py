"""``shardfuse watch DIR --zone Z`` as a subprocess against a real stack of its own: files created, modified,
renamed and deleted, a directory renamed, an editor's save-by-rename and vim's backup rename, each followed by
the index (the shards' document rows) within ``FOLLOW_S``; an ignored file never published; stopped with
Ctrl-C (pending changes published first) or killed outright, then changes made while nothing watched: the
next start catches up."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from shardfuse.pipeline.storage.cas import hash_content
from tests.integration.conftest import Stack, live_documents, running_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ZONE = "watched"
FOLLOW_S = 2.0  # the target: the index follows each change within this
START_S = 90.0  # catching up and starting to watch (the first events also wait for the workers' warm-up)
LATENCIES: dict[str, float] = {}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack({"SHARDFUSE_EMBEDDER__PROVIDER": "hashing", "SHARDFUSE_SHARDS": "2",
                        "SHARDFUSE_STACK__API_PORT": "0"}) as running:
        yield running


def tree_state(root: Path, base: Path, *, ignored: tuple[str, ...] = ()) -> dict[str, str]:
    """What the index must hold for ``root``: every file's document name -> content hash."""
    return {p.relative_to(base).as_posix(): hash_content(p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in ignored}


class Watch:
    """A running ``shardfuse watch``; its output lines are collected as they come."""

    def __init__(self, stack: Stack, base: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "shardfuse.workers.cli.main", "watch", "notes",
                                      "--zone", ZONE], cwd=base, env=stack.env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue[str] = queue.Queue()
        self.said: list[str] = []
        self.errors: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.errors.append), daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], put: Callable[[str], None]) -> None:
        for line in stream:
            put(line.rstrip("\n"))

    def line(self, startswith: str, timeout: float) -> str:
        """The next line starting with ``startswith`` (earlier lines are kept in ``said``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line {startswith!r} in {timeout}s; said {self.said}, "
                                     f"stderr {self.errors}, exit {self.proc.poll()}") from None
            self.said.append(line)
            if line.startswith(startswith):
                return line

    def drain(self) -> None:
        """Set aside the lines said so far."""
        while not self.lines.empty():
            self.said.append(self.lines.get())

    def stop(self, sig: signal.Signals = signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        for reader in self._readers:  # to the end of the output
            reader.join(timeout=10)
        self.drain()
        return code


def follows(stack: Stack, what: str, expected: Callable[[dict[str, str]], bool]) -> None:
    """The index reaches ``expected`` within FOLLOW_S of the change just made (polled, bounded)."""
    start = time.monotonic()
    while not expected(held := live_documents(stack, ZONE)):
        if time.monotonic() - start > FOLLOW_S:
            raise AssertionError(f"{what}: the index did not follow within {FOLLOW_S}s; it holds {sorted(held)}")
        time.sleep(0.05)
    LATENCIES[what] = round(time.monotonic() - start, 3)


def test_watch_follows_changes_and_catches_up_after_a_restart(stack: Stack) -> None:
    base = Path(tempfile.mkdtemp(prefix="shardfuse-watch-"))
    notes = base / "notes"
    notes.mkdir()
    (notes / ".gitignore").write_text("*.log\n")
    (notes / "a.md").write_text("alpha: the first note")
    (notes / "b.md").write_text("bravo: the second note")
    (notes / "old.log").write_text("ignored")
    try:
        watch = Watch(stack, base)
        assert watch.line("caught up notes/", START_S) == "caught up notes/: 3 written, 0 deleted, 0 unchanged"
        watch.line("watching notes", START_S)
        deadline = time.monotonic() + START_S
        while live_documents(stack, ZONE) != tree_state(notes, base, ignored=("old.log",)):
            assert time.monotonic() < deadline, f"catch-up not indexed: {live_documents(stack, ZONE)}"
            time.sleep(0.1)

        _follow_live_changes(stack, watch, notes, base)
        assert watch.stop(signal.SIGINT) == 0, watch.errors  # Ctrl-C: flush, then a clean exit
        assert watch.said[-1].startswith("stopped: published ")

        # Offline: nothing watches these.
        (notes / "c.md").write_text("charlie, changed while nothing watched")
        (notes / "moved.md").unlink()
        (notes / "echo.md").write_text("echo: new while nothing watched")
        watch = Watch(stack, base)
        assert watch.line("caught up notes/", START_S).startswith("caught up notes/: 2 written, 1 deleted, ")
        watch.line("watching notes", START_S)
        (notes / "foxtrot.md").write_text("foxtrot")
        follows(stack, "create after a restart", lambda held: "notes/foxtrot.md" in held)
        (notes / "golf.md").write_text("golf: written, then the watcher is killed")
        assert watch.stop(signal.SIGKILL) == -signal.SIGKILL  # killed: whatever it held is lost with it

        (notes / "echo.md").unlink()
        watch = Watch(stack, base)
        watch.line("caught up notes/", START_S)
        watch.line("watching notes", START_S)
        follows(stack, "caught up after a kill",
                lambda held: held == tree_state(notes, base, ignored=("old.log", "debug.log")))
        assert watch.stop(signal.SIGTERM) == 0, watch.errors
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"watch_follow_s": LATENCIES, "target_s": FOLLOW_S}))


def _follow_live_changes(stack: Stack, watch: Watch, notes: Path, base: Path) -> None:
    (notes / "c.md").write_text("charlie: created while watched")
    follows(stack, "create", lambda held: held.get("notes/c.md") == hash_content((notes / "c.md").read_bytes()))
    (notes / "a.md").write_text("alpha, modified")
    follows(stack, "modify", lambda held: held.get("notes/a.md") == hash_content(b"alpha, modified"))
    (notes / "b.md").rename(notes / "moved.md")
    follows(stack, "rename", lambda held: "notes/b.md" not in held and "notes/moved.md" in held)
    (notes / "c.md").unlink()
    follows(stack, "delete", lambda held: "notes/c.md" not in held)

    # An editor's save: write a temp file, rename it over the target. One write of the target, no delete.
    watch.drain()
    (notes / ".a.md.swp").write_text("alpha, saved by rename")
    os.replace(notes / ".a.md.swp", notes / "a.md")
    follows(stack, "save by rename", lambda held: held.get("notes/a.md") == hash_content(b"alpha, saved by rename"))
    assert watch.line("published ", 5) == "published 1 write, 0 deletes: notes/a.md"
    # vim: target → target~, write the new target, delete target~.
    watch.drain()
    (notes / "a.md").rename(notes / "a.md~")
    (notes / "a.md").write_text("alpha, saved by vim")
    (notes / "a.md~").unlink()
    follows(stack, "vim backup rename", lambda held: held.get("notes/a.md") == hash_content(b"alpha, saved by vim"))
    assert watch.line("published ", 5) == "published 1 write, 0 deletes: notes/a.md"

    (notes / "sub").mkdir()
    (notes / "sub" / "x.md").write_text("xray")
    (notes / "debug.log").write_text("ignored by .gitignore")
    follows(stack, "create in a new directory", lambda held: "notes/sub/x.md" in held)
    (notes / "sub").rename(notes / "sub2")
    follows(stack, "directory rename", lambda held: "notes/sub/x.md" not in held and "notes/sub2/x.md" in held)
    assert live_documents(stack, ZONE) == tree_state(notes, base, ignored=("old.log", "debug.log"))
