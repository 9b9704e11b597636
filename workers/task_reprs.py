"""What Flower and Celery's logs show of a message's arguments: the documents it carries, each as ``zone:path``.

Celery writes a ``kwargsrepr`` into every message (and its ``task-sent`` event) unless the sender gives one:
its repr of the keyword arguments, cut at 1,024 characters. For an ingest message that is its first few
events in full, so a path further down never shows and Flower's search cannot find the task that handled it;
for an embed message it is the first document's chunk text, after a repr walked through the whole ~50 KB body
(about a fifth of the send's CPU: 3.3 against 2.5 ms, docs/performance.md, session 36). :func:`kwargs_summary`
names every document instead, within the same length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_CHARS = 1024
_CARRIERS = frozenset({"documents", "events", "event"})


def kwargs_summary(kwargs: Mapping[str, Any]) -> str | None:
    """The ``kwargsrepr`` of a message of ``event``, ``events`` or ``documents`` (the ingest and embed forms):
    how many, the other arguments, then each document's ``zone:path`` (``-`` before a delete's), as far as
    :data:`MAX_CHARS` allows; None for any other message (Celery's own repr of its small arguments)."""
    if "documents" in kwargs:
        key, items = "documents", [document.get("event") for document in kwargs["documents"]]
    elif "events" in kwargs:
        key, items = "events", list(kwargs["events"])
    elif "event" in kwargs:
        key, items = "event", [kwargs["event"]]
    else:
        return None
    others = {name: value for name, value in kwargs.items() if name not in _CARRIERS}
    head = f"{key}={len(items)}" + "".join(f" {name}={value!r}" for name, value in others.items()) + ":"
    shown = head
    for count, item in enumerate(items):
        name, after = _name(item), len(items) - count - 1  # after: the names left once this one is shown
        # Shown only if the count of those left still fits after it, so a cut text always fits.
        if len(shown) + 1 + len(name) + (len(f" … (+{after} more)") if after else 0) > MAX_CHARS:
            return f"{shown} … (+{after + 1} more)"
        shown += " " + name
    return shown


def _name(event: object) -> str:
    if not isinstance(event, Mapping):
        return "?"
    deleted = "-" if event.get("op") == "delete" else ""
    return f"{deleted}{event.get('zone')}:{event.get('path')}"
