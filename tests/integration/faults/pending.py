"""What a fault test's drain says when it runs out of time: each message still pending, where it sits (a queue, a
consumer's inbox, kombu's unacked hash), for how long, and the last log lines that name its task id. A drain
that failed once under load (session 21: one ingest message, its cause never found) should explain itself
the next time."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shardfuse.workers.broker.inbox import INBOXES_KEY, UNACKED, UNACKED_INDEX
from shardfuse.workers.names import PUBLISHED_HEADER

LOG_LINES = 3


def describe_pending(client: Any, *, queues: Iterable[str], logs: Path | None = None,
                     now: float | None = None) -> list[str]:
    """One line per message waiting in ``queues`` (their names), in a consumer's inbox or unacknowledged (then the last
    ``LOG_LINES`` lines of the component logs under ``logs`` naming its task id). Never raises on a message
    it cannot read: it says so instead."""
    now = time.time() if now is None else now
    wanted = set(queues)
    lines: list[str] = []
    task_ids: list[str] = []

    def add(where: str, payload: Any, size: int) -> None:
        headers = payload.get("headers") if isinstance(payload, dict) else None
        if not isinstance(headers, dict):
            lines.append(f"{where}: an item that is no task message ({size} bytes)")
            return
        task_ids.append(str(headers.get("id")))
        lines.append(f"{where}: {headers.get('task')}[{headers.get('id')}], retries {headers.get('retries')}, "
                     f"published {_ago(headers.get(PUBLISHED_HEADER), now)}")

    for queue in sorted(wanted):
        for item in client.lrange(queue, 0, -1):
            add(f"waiting in {queue}", _json(item), len(item))
    for inbox, raw in client.hgetall(INBOXES_KEY).items():
        entry = _json(raw) or {}
        if entry.get("queue") not in wanted:
            continue
        for item in client.lrange(inbox, 0, -1):
            add(f"in inbox {_text(inbox)} (holder {entry.get('holder')}, registered {_ago(entry.get('seen'), now)})",
                _json(item), len(item))
    delivered = {_text(tag): score for tag, score in client.zrange(UNACKED_INDEX, 0, -1, withscores=True)}
    for tag, raw in client.hgetall(UNACKED).items():
        record = _json(raw)  # kombu's [payload, exchange, routing key]
        if not isinstance(record, list) or len(record) != 3 or record[2] not in wanted:
            continue
        add(f"unacked from {record[2]} (tag {_text(tag)}, delivered {_ago(delivered.get(_text(tag)), now)})",
            record[0], len(raw))
    return lines + (_log_mentions(task_ids, logs) if logs is not None else [])


def _log_mentions(task_ids: list[str], logs: Path) -> list[str]:
    """The last ``LOG_LINES`` lines of every log under ``logs`` that name each of ``task_ids`` (each log read once)."""
    texts = [(log.name, log.read_text(errors="replace").splitlines())
             for log in sorted(logs.glob("*")) if log.is_file()]
    out: list[str] = []
    for task_id in task_ids:
        if task_id in ("", "None"):
            continue
        for name, log_lines in texts:
            hits = [line for line in log_lines if task_id in line]
            out.extend(f"  {name}: {hit[:300]}" for hit in hits[-LOG_LINES:])
    return out


def _json(raw: Any) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ago(at: Any, now: float) -> str:
    try:
        return f"{now - float(at):.1f} s ago"
    except (TypeError, ValueError):
        return "at an unknown time"
