"""The grep mode on the real stack, over a slice of celery's installed source (a codebase nobody here wrote):
for exact strings of every frequency, the lines returned are exactly the lines Python's own search over the
files finds; regexes and case-insensitive literals likewise; zones, path prefixes, rewrites and deletes as
the chunks have them; and the grep leg joins hybrid search for a code-like query."""

from __future__ import annotations

import re
from pathlib import Path

import celery
import psycopg
import pytest
from psycopg import sql

from shardfuse.pipeline.index.store.grep_store import candidate_blocks, count_candidate_blocks
from shardfuse.pipeline.index.store.schema import shard_schema
from shardfuse.query.grep.pattern import GrepPattern
from shardfuse.query.grep.search import index_clauses
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

SOURCE = Path(celery.__file__).parent / "app"
ZONE = "grep-celery"
MAX_K = 1000
# Exact strings from rare to frequent, some with punctuation BM25 cannot express.
LITERALS = ["def send_task(", "self.app", "apply_async", "AsyncResult", "import", "kwargs", "Celery", "**options",
            "= None", "] = ", "_CELERY_"]
REGEXES = [r"^\s*def _\w+\(self", r"raise \w+Error\(", r"(?:task|app)\.conf\.[a-z_]+", r"^class \w+\(\w*\):$"]


def _files() -> dict[str, str]:
    return {f"celery/app/{p.name}": p.read_text(encoding="utf-8") for p in sorted(SOURCE.glob("*.py"))}


def _python_grep(files: dict[str, str], pattern: re.Pattern[str]) -> list[tuple[str, int]]:
    """Python's own search: every line (split at "\\n", as grep splits) that holds a match."""
    return [(path, n) for path, text in sorted(files.items())
            for n, line in enumerate(text.split("\n"), start=1) if pattern.search(line)]


def _lines(answer: dict) -> list[tuple[str, int]]:
    return [(hit["path"], hit["line"]) for hit in answer["results"]]


@pytest.fixture(scope="module")
def indexed(stack: Stack) -> dict[str, str]:
    files = _files()
    with stack.publisher() as publisher:
        for path, text in files.items():
            publisher.write(zone=ZONE, path=path, data=text.encode("utf-8"))
    stack.wait(timeout=300)
    return files


def test_every_line_holding_an_exact_string_and_nothing_else(stack: Stack, indexed: dict[str, str]) -> None:
    counts = {}
    for literal in LITERALS:
        want = _python_grep(indexed, re.compile(re.escape(literal)))
        answer = stack.search(literal, ZONE, mode="grep", k=MAX_K, cache=False)
        assert answer["truncated"] is (len(want) > MAX_K), literal
        assert _lines(answer) == want[:MAX_K], literal
        counts[literal] = len(want)
        for hit in answer["results"][:20]:
            line = indexed[hit["path"]].split("\n")[hit["line"] - 1]
            assert hit["text"] == line[: len(hit["text"])] or "…" in hit["text"]
            assert literal in line and hit["chunk_id"] and hit["zone"] == ZONE
    assert min(counts.values()) <= 2 and max(counts.values()) >= 200, counts  # rare and frequent strings both


def test_regexes_and_case_insensitive_literals(stack: Stack, indexed: dict[str, str]) -> None:
    for regex in REGEXES:
        want = _python_grep(indexed, re.compile(regex))
        answer = stack.search(regex, ZONE, mode="grep", regex=True, k=MAX_K)
        assert want and _lines(answer) == want, regex
    want = _python_grep(indexed, re.compile("asyncresult", re.IGNORECASE))
    answer = stack.search("asyncresult", ZONE, mode="grep", case_sensitive=False, k=MAX_K)
    assert len(want) > len(_python_grep(indexed, re.compile("AsyncResult"))) - 1 and _lines(answer) == want


def test_few_lines_then_truncated_and_the_chunk_of_a_line_hydrates(stack: Stack, indexed: dict[str, str]) -> None:
    answer = stack.search("self", ZONE, mode="grep", k=5)
    assert len(answer["results"]) == 5 and answer["truncated"] is True
    assert _lines(answer) == _python_grep(indexed, re.compile("self"))[:5]
    hit = stack.search("def send_task(", ZONE, mode="grep")["results"][0]
    chunks = stack.search("send_task", ZONE, mode="keyword", k=50)["results"]
    holding = [c for c in chunks if c["chunk_id"] == hit["chunk_id"]]
    assert holding and holding[0]["start_line"] <= hit["line"] <= holding[0]["end_line"]


def test_zone_path_prefix_rewrite_and_delete(stack: Stack, indexed: dict[str, str]) -> None:
    zone = "grep-fresh"
    with stack.publisher() as publisher:
        publisher.write(zone=zone, path="src/a.py", data=b"first = 'zqx_marker_one'\n")
        publisher.write(zone=zone, path="docs/b.md", data=b"zqx_marker_one in the docs\n")
    stack.wait()
    assert _lines(stack.search("zqx_marker", zone, mode="grep")) == [("docs/b.md", 1), ("src/a.py", 1)]
    assert _lines(stack.search("zqx_marker", zone, mode="grep", path_prefix="src/")) == [("src/a.py", 1)]
    assert stack.search("zqx_marker", ZONE, mode="grep")["results"] == []  # another zone sees none of it
    with stack.publisher() as publisher:
        publisher.write(zone=zone, path="src/a.py", data=b"\n\nsecond = 'zqx_marker_two'\n")
        publisher.delete(zone=zone, path="docs/b.md")
    stack.wait()
    answer = stack.search("zqx_marker", zone, mode="grep", cache=False)
    assert [(h["path"], h["line"], h["text"]) for h in answer["results"]] == [
        ("src/a.py", 3, "second = 'zqx_marker_two'")]


def test_bad_grep_requests_are_refused_with_reasons(stack: Stack, indexed: dict[str, str]) -> None:
    with pytest.raises(Exception, match="RE2"):
        stack.search(r"(a)\1", ZONE, mode="grep", regex=True)
    with pytest.raises(Exception, match="path_prefix or filters"):
        stack.search(r"\w+", ZONE, mode="grep", regex=True)
    with pytest.raises(Exception, match="mode 'grep' only"):
        stack.search("apply_async", ZONE, regex=True)


def test_a_code_like_hybrid_query_fuses_the_grep_leg(stack: Stack, indexed: dict[str, str]) -> None:
    answer = stack.search("send_task apply_async", ZONE, k=5, cache=False)
    assert "grep" in answer["timings_ms"], answer["timings_ms"]
    assert any("send_task" in hit["text"] for hit in answer["results"][:3])


def test_the_cli_greps(stack: Stack, indexed: dict[str, str]) -> None:
    out = stack.cli("search", "def send_task(", "--zone", ZONE, "--grep").stdout
    path, line = _python_grep(indexed, re.compile(re.escape("def send_task(")))[0]
    assert f"{path}:{line}:" in out and "def send_task(" in out
    out = stack.cli("search", r"^class \w+", "--zone", ZONE, "--grep", "--regex", "-k", "3").stdout
    assert out.count("celery/app/") == 3 and "more not shown" in out


def test_the_grep_legs_count_of_candidate_blocks_is_the_number_of_blocks_a_read_finds(
        stack: Stack, indexed: dict[str, str]) -> None:
    """The hybrid grep leg asks for a token's candidate blocks' count before reading any: that count, on the real
    GIN index, is exactly how many blocks the read returns, and stops at its cap."""
    seen = 0
    for literal in ("apply_async", "import", "self.app", "_CELERY_"):
        any_of = index_clauses(GrepPattern(literal, regex=False, case_sensitive=True), zone=ZONE, where=None)
        for shard in range(stack.settings.shards):
            schema = sql.Identifier(shard_schema(shard))
            with psycopg.connect(stack.settings.shard_dsn(shard)) as conn:
                read = candidate_blocks(conn, schema, zone=ZONE, any_of=any_of, where=None, after=None, limit=100_000)
                count = count_candidate_blocks(conn, schema, zone=ZONE, any_of=any_of, where=None, cap=100_000)
                assert count == len(read), (literal, shard)
                capped = count_candidate_blocks(conn, schema, zone=ZONE, any_of=any_of, where=None, cap=3)
                assert capped == min(3, count)
                seen += count
    assert seen > 10  # the literals are in the slice
