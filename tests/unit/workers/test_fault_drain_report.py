"""What a fault test's drain reports when it times out: every pending message of the pipeline queues, wherever it
sits (queue, a consumer's inbox, kombu's unacked hash), with its age and the log lines naming its task id."""

from __future__ import annotations

import json
from pathlib import Path

import fakeredis

from shardfuse.workers.broker.inbox import INBOXES_KEY, UNACKED, UNACKED_INDEX
from shardfuse.workers.names import PUBLISHED_HEADER
from tests.integration.faults.pending import describe_pending

NOW = 1_000_000.0


def _message(task_id: str, *, published: float) -> dict[str, object]:
    # kombu's Redis payload: the body and Celery's protocol-2 headers
    return {"body": "W10=", "content-type": "application/json", "content-encoding": "utf-8",
            "headers": {"task": "shardfuse.ingest", "id": task_id, "retries": 1, PUBLISHED_HEADER: published},
            "properties": {"delivery_tag": "t"}}


def test_a_message_in_each_place_is_named_with_its_age_and_log_lines(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis()
    client.lpush("ingest", json.dumps(_message("waiting-1", published=NOW - 12)))
    client.hset(INBOXES_KEY, "shardfuse:inbox:c1:embed", json.dumps({"holder": "c1", "queue": "embed",
                                                                      "seen": NOW - 3}))
    client.lpush("shardfuse:inbox:c1:embed", json.dumps(_message("inbox-1", published=NOW - 5)))
    client.hset(UNACKED, "tag-9", json.dumps([_message("unacked-1", published=NOW - 200), "", "ingest"]))
    client.zadd(UNACKED_INDEX, {"tag-9": NOW - 150})
    client.lpush("query", json.dumps(_message("a-search", published=NOW)))  # not a pipeline queue: left out
    client.lpush("ingest", b"\x00not json")
    (tmp_path / "worker-ingest.log").write_text("".join(f"retry {n} of unacked-1\n" for n in range(5)))

    lines = describe_pending(client, queues=["ingest", "embed", "maintenance"], logs=tmp_path, now=NOW)

    assert "waiting in ingest: shardfuse.ingest[waiting-1], retries 1, published 12.0 s ago" in lines
    assert "waiting in ingest: an item that is no task message (9 bytes)" in lines
    assert ("in inbox shardfuse:inbox:c1:embed (holder c1, registered 3.0 s ago): shardfuse.ingest[inbox-1], "
            "retries 1, published 5.0 s ago") in lines
    assert ("unacked from ingest (tag tag-9, delivered 150.0 s ago): shardfuse.ingest[unacked-1], retries 1, "
            "published 200.0 s ago") in lines
    assert not any("a-search" in line for line in lines)
    # the last three log lines naming the unacked message's id, and none for ids no log names
    assert [line for line in lines if line.startswith("  ")] == [
        f"  worker-ingest.log: retry {n} of unacked-1" for n in (2, 3, 4)]


def test_nothing_pending_says_nothing() -> None:
    assert describe_pending(fakeredis.FakeRedis(), queues=["ingest"], now=NOW) == []
