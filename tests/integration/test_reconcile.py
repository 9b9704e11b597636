"""``shardfuse reconcile DIR --zone Z`` on the real embedded stack: after files changed, appeared and vanished
behind the index's back (their events never published), ``--dry-run`` reports exactly the difference,
``reconcile`` publishes exactly it, and the index then holds exactly the tree (and what lies outside it is
untouched)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from shardfuse.pipeline.storage.cas import hash_content
from tests.integration.conftest import Stack, live_documents

pytestmark = pytest.mark.integration

ZONE = "reconcile"
WORDS = ["quokka", "narwhal", "axolotl", "pangolin", "okapi", "tapir", "dugong", "fossa", "kinkajou", "margay"]


def run_cli(stack: Stack, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``shardfuse …`` run from ``cwd`` (document names are relative to the working directory)."""
    proc = subprocess.run([sys.executable, "-m", "shardfuse.workers.cli.main", *args], env=stack.env, cwd=cwd,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"shardfuse {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}"
    return proc


def note(word: str, version: int = 1) -> bytes:
    return f"Field notes, version {version}: the {word} is rarely seen; {word} sightings are logged here.".encode()


def keyword_paths(stack: Stack, word: str) -> set[str]:
    answer: dict[str, Any] = stack.search(word, ZONE, mode="keyword", k=20, cache=False)
    return {hit["path"] for hit in answer["results"]}


def test_reconcile_publishes_exactly_the_difference(stack: Stack) -> None:
    base = Path(tempfile.mkdtemp(prefix="shardfuse-reconcile-"))
    try:
        tree = base / "notes"
        tree.mkdir()
        for word in WORDS[:7]:
            (tree / f"{word}.txt").write_bytes(note(word))
        run_cli(stack, base, "publish", "notes", "--zone", ZONE)
        with stack.publisher() as publisher:  # a document outside the tree: reconcile must leave it alone
            publisher.write(zone=ZONE, path="elsewhere/keep.txt", data=note("keep"))
        stack.wait()
        assert set(live_documents(stack, ZONE)) == {f"notes/{w}.txt" for w in WORDS[:7]} | {"elsewhere/keep.txt"}

        # Behind the index's back: two files changed, three new, two removed.
        for word in WORDS[:2]:
            (tree / f"{word}.txt").write_bytes(note(word, version=2))
        for word in WORDS[7:]:
            (tree / f"{word}.txt").write_bytes(note(word))
        for word in WORDS[5:7]:
            (tree / f"{word}.txt").unlink()
        expected_writes = sorted(f"notes/{w}.txt" for w in [*WORDS[:2], *WORDS[7:]])
        expected_deletes = sorted(f"notes/{w}.txt" for w in WORDS[5:7])
        before = live_documents(stack, ZONE)

        dry = json.loads(run_cli(stack, base, "reconcile", "notes", "--zone", ZONE, "--dry-run", "--json").stdout)
        assert (dry["write"], dry["delete"], dry["unchanged"]) == (expected_writes, expected_deletes, 3)
        assert (dry["walked"], dry["compared"], dry["events"]) == (8, 7, [])
        stack.wait()
        assert live_documents(stack, ZONE) == before, "a dry run changed the index"
        text = run_cli(stack, base, "reconcile", "notes", "--zone", ZONE, "--dry-run").stdout
        assert f"would write {len(expected_writes)}, delete {len(expected_deletes)}; 3 unchanged" in text

        done = json.loads(run_cli(stack, base, "reconcile", "notes", "--zone", ZONE, "--json").stdout)
        events = sorted((e["op"], e["path"]) for e in done["events"])
        assert events == sorted([("write", p) for p in expected_writes] + [("delete", p) for p in expected_deletes])
        assert done["messages"] >= 1
        stack.wait()

        tree_hashes = {f"notes/{f.name}": hash_content(f.read_bytes()) for f in tree.iterdir()}
        assert live_documents(stack, ZONE) == {**tree_hashes, "elsewhere/keep.txt": hash_content(note("keep"))}
        # Both legs follow: new files are found, removed ones are not, changed ones hold their new text.
        assert keyword_paths(stack, WORDS[8]) == {f"notes/{WORDS[8]}.txt"}
        assert keyword_paths(stack, WORDS[6]) == set()
        assert {h["path"] for h in stack.search(f"the {WORDS[9]} is rarely seen", ZONE, mode="semantic", k=3,
                                                cache=False)["results"]} >= {f"notes/{WORDS[9]}.txt"}
        assert "version 2" in stack.search(WORDS[0], ZONE, mode="keyword", k=1, cache=False)["results"][0]["text"]

        again = json.loads(run_cli(stack, base, "reconcile", "notes", "--zone", ZONE, "--json").stdout)
        assert (again["write"], again["delete"], again["events"], again["unchanged"]) == ([], [], [], 8)
    finally:
        shutil.rmtree(base, ignore_errors=True)
