"""What Flower shows of a message's arguments (shardfuse.workers.task_reprs): every document it carries as
zone:path, within Celery's 1,024 characters, instead of a repr cut after the first few events."""

from __future__ import annotations

from typing import Any

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.workers.app import create_app
from shardfuse.workers.names import Queue
from shardfuse.workers.publishing import CeleryEventSink
from shardfuse.workers.task_reprs import MAX_CHARS, kwargs_summary


def _event(path: str, *, op: str = "write", zone: str = "docs") -> dict[str, Any]:
    return {"event_id": "e" * 32, "op": op, "zone": zone, "path": path, "seq": 1}


def test_every_event_of_a_message_is_named_with_the_other_arguments() -> None:
    kwargs = {"events": [_event("a.md"), _event("old.md", op="delete"), _event("b.py", zone="code")], "refresh": True}
    assert kwargs_summary(kwargs) == "events=3 refresh=True: docs:a.md -docs:old.md code:b.py"
    assert kwargs_summary({"event": _event("a.md")}) == "event=1: docs:a.md"


def test_an_embed_message_is_named_by_its_documents_events_not_its_chunks() -> None:
    documents = [{"event": _event(f"{i}.txt"), "chunks": [{"text": "x" * 50_000}]} for i in range(3)]
    assert kwargs_summary({"documents": documents}) == "documents=3: docs:0.txt docs:1.txt docs:2.txt"


def test_a_long_list_is_cut_within_the_limit_and_says_how_many_more() -> None:
    kwargs = {"events": [_event(f"src/module_{i:04d}/implementation.py") for i in range(200)]}
    summary = kwargs_summary(kwargs)
    assert summary is not None and len(summary) <= MAX_CHARS
    assert summary.startswith("events=200: docs:src/module_0000/implementation.py ")
    shown = summary.count("implementation.py")
    assert summary.endswith(f" … (+{200 - shown} more)") and shown > 10


def test_other_messages_keep_celerys_own_repr() -> None:
    assert kwargs_summary({"shard": 3, "merge": True}) is None


def test_a_published_message_carries_the_summary() -> None:
    app = create_app(Settings(broker={"url": "memory://", "result_backend": "cache+memory://"}))
    with app.producer_or_acquire() as producer:
        sink = CeleryEventSink(app, producer, events_per_message=16)
        for path in ("a.md", "b.md"):
            sink.send(WriteEvent(op=Op.DELETE, zone="docs", path=path, seq=1))
        sink.flush()
    with app.connection_for_read() as conn:
        payload: dict[str, Any] = conn.default_channel._get(Queue.INGEST.value)
    assert payload["headers"]["kwargsrepr"] == "events=2: -docs:a.md -docs:b.md"
