"""The ingest hard time limit on a real prefork worker (issue 20, item 2): a run it kills is not
acknowledged and lost, and a message it kills every time is dead-lettered after MAX_STRIKES kills instead of
coming back forever.

What overruns: a 9.9 MB generated Python file. The code chunker parses it with :mod:`ast`, one C call that
holds the interpreter lock for seconds, so neither the document's deadline nor the soft time limit (a
signal the main thread handles only once it gets the lock back) can stop it: the hard limit kills the
process. That is the case the hard limit exists for.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfuse.workers.tasks.strikes import MAX_STRIKES
from tests.integration.conftest import Stack, running_stack
from tests.integration.test_document_deadlines import dead_letters, indexed, ingest_processes
from tests.support.polling import eventually

pytestmark = pytest.mark.integration
SOFT_S, HARD_S = 2, 3
ZONE = "hard-limit"


@pytest.fixture(scope="module")
def limited_stack() -> Iterator[Stack]:
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_SHARDS": "2",
        "SHARDFUSE_INGEST__DOCUMENT_DEADLINE_S": "1",
        "SHARDFUSE_WORKERS__INGEST_LIMITS__SOFT_S": str(SOFT_S),
        "SHARDFUSE_WORKERS__INGEST_LIMITS__HARD_S": str(HARD_S),
        # The killed process's document leases are released soon after it stops beating.
        "SHARDFUSE_DELIVERY__HEARTBEAT_S": "1",
        "SHARDFUSE_DELIVERY__DEAD_AFTER_S": "3",
        "SHARDFUSE_DELIVERY__BUSY_RETRY_S": "1",
    }
    with running_stack(overrides) as stack:
        yield stack


def test_a_message_the_hard_limit_kills_comes_back_and_is_dead_lettered_after_its_strikes(
    limited_stack: Stack,
) -> None:
    before = ingest_processes(limited_stack)
    big = ("f(a)\n" * 2_000_000)[:9_900_000].encode()
    with limited_stack.publisher() as publisher:
        publisher.write(zone=ZONE, path="generated/big.py", data=big)
    dead = eventually(lambda: dead_letters(limited_stack, ZONE), timeout=300, what="the killed message's dead letter")
    log = Path(limited_stack.state.components["worker-ingest"].log).read_text()

    assert [letter["path"] for letter in dead] == ["generated/big.py"]  # came back, then set aside: not lost
    assert dead[0]["error_class"] == "shardfuse.workers.tasks.strikes.HardTimeLimitError"
    assert f"exceeded the hard time limit ({HARD_S}s) {MAX_STRIKES} times" in dead[0]["reason"]
    kills = re.findall(r"was killed by its hard time limit \(its items' strike (\d+) of", log)
    assert [int(k) for k in kills] == list(range(1, MAX_STRIKES + 1)), log[-4000:]
    assert indexed(limited_stack, ZONE) == {}
    assert ingest_processes(limited_stack) != before  # the limit did kill: the pool replaced its processes

    # The queue goes on: the next document is indexed.
    with limited_stack.publisher() as publisher:
        publisher.write(zone=ZONE, path="small.md", data=b"# Small\n\nA small document after the big one.\n")
    limited_stack.wait(timeout=120)
    assert list(indexed(limited_stack, ZONE)) == ["small.md"]
    print(f"\nkilled by the {HARD_S}s hard limit {len(kills)} times, redelivered each time, then dead-lettered: "
          f"{dead[0]['reason'][:60]}...")
