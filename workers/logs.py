"""Structured logs: one JSON object per line, carrying what the line is about.

``[logging] format = "json"`` (``SHARDFUSE_LOGGING__FORMAT=json``) switches the workers (through Celery's
logger set-up signals, :mod:`shardfuse.workers.observability`) and the CLI to :class:`JsonFormatter`; ``"text"``
leaves every format as it was.

Each line holds ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, ``hostname``, ``pid``, and,
from :func:`log_context`: ``task`` and ``task_id`` inside a task, ``worker`` (its Celery node), and
``event_id`` and ``zone`` while one event or document is worked on. A traceback goes in ``exception``.
The context lives in a :class:`contextvars.ContextVar`: each thread has its own, so the threads a task
starts pass theirs on explicitly (``log_context(**log_fields(), event_id=…)``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

LOG_FORMATS = ("text", "json")
_CONTEXT: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "shardfuse_log_context", default=MappingProxyType({}))
# Attributes every LogRecord has: anything else on a record came from ``extra=`` and is written out too.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def log_fields() -> dict[str, str]:
    """The context of lines logged here and now."""
    return dict(_CONTEXT.get())


@contextlib.contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Add ``fields`` (None values left out) to every line logged in this block, on this thread."""
    added = {k: str(v) for k, v in fields.items() if v is not None}
    token = _CONTEXT.set({**_CONTEXT.get(), **added})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def set_log_fields(fields: Mapping[str, object]) -> None:
    """Replace this thread's context (a task's start and end, which are two signals, not one block)."""
    _CONTEXT.set({k: str(v) for k, v in fields.items() if v is not None})


def item_fields(item: Any) -> dict[str, str]:
    """``event_id`` and ``zone`` of a message item: an ingest event, or an embed document (which holds its
    event); empty for anything else."""
    event = item.get("event") if isinstance(item, dict) and isinstance(item.get("event"), dict) else item
    if not isinstance(event, dict):
        return {}
    return {k: event[k] for k in ("event_id", "zone") if isinstance(event.get(k), str)}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self) -> None:
        super().__init__()
        self._hostname = socket.gethostname()

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "hostname": self._hostname,
            "pid": record.process if record.process is not None else os.getpid(),
            "thread": record.threadName,
        }
        line.update(_CONTEXT.get())
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def use_format(handlers: Iterable[logging.Handler], log_format: str) -> None:
    """Give ``handlers`` the JSON formatter when ``log_format`` is ``json``; leave them alone otherwise."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    if log_format == "json":
        for handler in handlers:
            handler.setFormatter(JsonFormatter())


def configure_cli_logging(log_format: str) -> None:
    """The CLI's log lines (set up by ``logging.basicConfig``) in ``log_format``."""
    use_format(logging.getLogger().handlers, log_format)
