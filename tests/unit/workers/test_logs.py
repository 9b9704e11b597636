"""Structured logs (shardfuse.workers.logs, shardfuse.workers.observability): JSON lines carrying the task and the
event they
are about, switched on by ``[logging] format``; text lines unchanged otherwise."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, signals

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.logs import JsonFormatter, item_fields, log_context, log_fields, use_format
from shardfuse.workers.observability import connect_observability

TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logger = logging.getLogger("shardfuse.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, stream, handler
    finally:
        logger.removeHandler(handler)


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_logged_while_an_event_is_worked_on_carries_its_event_id_and_zone(captured: Any) -> None:
    logger, stream, handler = captured
    use_format([handler], "json")
    event = {"event_id": "ev-42", "op": "write", "zone": "docs", "path": "a.md", "seq": 1}
    with log_context(task="shardfuse.ingest", task_id="t-1"):
        logger.info("message received")
        with log_context(**item_fields(event)):
            logger.warning("chunked %d spans", 3)
            with log_context(**item_fields({"event": {**event, "event_id": "ev-43"}, "chunks": []})):
                logger.info("an embed document names its event")
        logger.info("between items")
    logger.info("outside the task")

    received, chunked, embedded, between, outside = _lines(stream)
    assert chunked["message"] == "chunked 3 spans" and chunked["level"] == "WARNING"
    assert chunked["logger"] == "shardfuse.test.logs"
    assert (chunked["event_id"], chunked["zone"], chunked["task"], chunked["task_id"]) == ("ev-42", "docs",
                                                                                           "shardfuse.ingest", "t-1")
    assert (embedded["event_id"], embedded["zone"]) == ("ev-43", "docs")
    assert {"time", "hostname", "pid"} <= set(chunked) and chunked["time"].endswith("Z")
    assert "event_id" not in received and "event_id" not in between and between["task_id"] == "t-1"
    assert not {"event_id", "zone", "task"} & set(outside)


def test_each_thread_has_its_own_context_and_threads_pass_theirs_on(captured: Any) -> None:
    logger, stream, handler = captured
    use_format([handler], "json")

    def event_thread(inherited: dict[str, str]) -> None:
        logger.info("bare thread")  # a new thread starts with no context
        with log_context(**inherited, event_id="ev-7", zone="code"):
            logger.info("in the event thread")

    with log_context(task="shardfuse.ingest", task_id="t-2"):
        thread = threading.Thread(target=event_thread, args=(log_fields(),))
        thread.start()
        thread.join()
    bare, worked = _lines(stream)
    assert "task_id" not in bare
    assert (worked["task_id"], worked["event_id"], worked["zone"]) == ("t-2", "ev-7", "code")


def test_exceptions_and_extra_fields_stay_on_one_line(captured: Any) -> None:
    logger, stream, handler = captured
    use_format([handler], "json")
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("failed", extra={"shard": 3})
    (line,) = stream.getvalue().splitlines()  # one physical line, whatever the traceback holds
    record = json.loads(line)
    assert record["shard"] == 3 and "ValueError: bad" in record["exception"]


def test_text_mode_leaves_the_format_unchanged(captured: Any) -> None:
    logger, stream, handler = captured
    before = handler.formatter
    use_format([handler], "text")
    with log_context(event_id="ev-1", zone="docs"):
        logger.info("hello %s", "there")
    assert handler.formatter is before
    assert stream.getvalue() == "INFO shardfuse.test.logs: hello there\n"
    with pytest.raises(ValueError, match="log format"):
        use_format([handler], "xml")


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_celery_logger_set_up_follows_the_setting(log_format: str) -> None:
    settings = Settings(logging={"format": log_format})
    app = Celery("test-logs", set_as_current=False)
    app.shardfuse_settings = settings  # type: ignore[attr-defined]
    disconnect = connect_observability(app)
    handler = logging.StreamHandler(io.StringIO())
    text = logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(text)
    logger = logging.getLogger("shardfuse.test.celery_setup")
    logger.addHandler(handler)
    try:
        signals.after_setup_logger.send(sender=None, logger=logger, loglevel=logging.INFO, logfile=None,
                                        format="", colorize=False)
        assert isinstance(handler.formatter, JsonFormatter) if log_format == "json" else handler.formatter is text
        # A task's lines carry its name, id and worker, from its start to its end.
        task = type("FakeTask", (), {"name": "shardfuse.embed", "request": type("R", (), {"hostname": "embed@h"})})
        signals.task_prerun.send(sender=task, task_id="t-9", task=task, args=(), kwargs={})
        assert log_fields() == {"task": "shardfuse.embed", "task_id": "t-9", "worker": "embed@h"}
        signals.task_postrun.send(sender=task, task_id="t-9", task=task, args=(), kwargs={}, retval=None,
                                  state="SUCCESS")
        assert log_fields() == {}
    finally:
        disconnect()
        logger.removeHandler(handler)
