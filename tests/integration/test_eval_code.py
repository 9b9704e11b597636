"""``shardfuse eval-code`` on a small Python tree through the real stack (hashing embedder): it indexes the tree,
asks for its definitions by name and by docstring, and counts a definition found only when the search
returns the chunk holding it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from shardfuse.query.evaluation.code_sampling import find_definitions, sample_cases
from shardfuse.query.evaluation.code_scoring import summarize
from shardfuse.workers.cli.eval_code import ask, read_tree
from shardfuse.workers.client import SearchClient
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

EVENTS = '''\
"""Events on the bus."""
import json


def parse_event(raw):
    """Decode one wire frame into a mapping of header fields and the payload."""
    return json.loads(raw)


class EventBus:
    """Fans events out to subscribers."""

    def subscribe_handler(self, handler):
        """Register a callable that receives every delivered notification."""
        self.handlers.append(handler)

    def deliver_event(self, raw):
        """Hand a decoded frame to each registered callable in turn."""
        for handler in self.handlers:
            handler(parse_event(raw))
'''

TRANSPORT = '''\
"""Channels to the broker."""
from bus.events import parse_event


def open_channel(url, retries=3):
    """Connect to the broker address, trying again a few times before giving up."""
    return url, retries


def drain_frames(frames):
    """Read pending frames and decode them (parse_event, parse_event, parse_event)."""
    return [parse_event(f) for f in frames] + [parse_event(f) for f in frames if parse_event(f)]
'''

ABSENT = '''\
def vanishing_helper(seed):
    """Compute a checksum of the sprocket registry for the audit trail."""
    return hash(seed)
'''


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "busproj"
    (root / "bus").mkdir(parents=True)
    (root / "bus" / "__init__.py").write_text("")
    (root / "bus" / "events.py").write_text(EVENTS)
    (root / "bus" / "transport.py").write_text(TRANSPORT)
    (root / "bus" / "absent.py").write_text(ABSENT)
    (root / "README.txt").write_text("not Python: not published by eval-code\n")
    return root


def test_eval_code_finds_each_definition_by_name_and_docstring(stack: Stack, tree: Path) -> None:
    zone = f"code-{uuid.uuid4().hex[:8]}"
    proc = stack.cli("eval-code", str(tree), "--zone", zone, "--json", "--misses", check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]  # 0: every target met
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # 4 files (the empty __init__.py too), 7 definitions, all names distinct: 7 name cases; the 6 documented
    # functions and methods are the docstring cases (a class is asked for by name only).
    assert (report["files"], report["definitions"]) == (4, 7)
    assert report["name"]["cases"] == 7
    assert report["docstring"]["cases"] == 6
    assert report["name"]["hit@1"] == 1.0, proc.stdout
    assert report["docstring"]["hit@5"] == 1.0, proc.stdout
    assert report["name"]["passed"] and report["docstring"]["passed"]
    assert "no misses" in proc.stdout


def test_a_definition_missing_from_the_index_is_counted_not_found(stack: Stack, tree: Path) -> None:
    zone = f"code-{uuid.uuid4().hex[:8]}"
    stack.cli("eval-code", str(tree), "--zone", zone, timeout=300)
    with stack.publisher() as publisher:
        publisher.delete(zone=zone, path="busproj/bus/absent.py")
    stack.wait()

    documents = read_tree(tree)
    assert set(documents) == {"busproj/bus/__init__.py", "busproj/bus/events.py", "busproj/bus/transport.py",
                              "busproj/bus/absent.py"}
    definitions = [d for path, text in documents.items() for d in find_definitions(path, text)]
    cases = sample_cases(definitions, n=50, seed=1)
    outcomes = ask(cases, zone=zone, client=SearchClient(stack.settings), options={"mode": "hybrid", "cache": False})
    missing = {(o.case.kind, o.case.target.name) for o in outcomes if not o.found}
    assert missing == {("name", "vanishing_helper"), ("docstring", "vanishing_helper")}
    assert all(o.rank is None for o in outcomes if o.case.target.name == "vanishing_helper")
    summary = summarize(outcomes)
    assert summary["name"]["hit@1"] == round(6 / 7, 4)
    assert summary["docstring"]["hit@5"] == round(5 / 6, 4)
    # What is found is the chunk holding the definition line, by path and lines.
    found = next(o for o in outcomes if o.case.kind == "name" and o.case.target.name == "deliver_event")
    top = found.top[0]
    assert top["path"] == "busproj/bus/events.py"
    assert top["start_line"] <= found.case.target.line <= top["end_line"]
