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
    for queue in sorted(wanted):
        for item in client.lrange(queue, 0, -1):
            lines.append(f"waiting in {queue}: {_message(item, now)}")
    for inbox, raw in client.hgetall(INBOXES_KEY).items():
        entry = _json(raw) or {}
        if entry.get("queue") not in wanted:
            continue
        for item in client.lrange(inbox, 0, -1):
            seen = entry.get("seen")
            lines.append(f"in inbox {_text(inbox)} (holder {entry.get('holder')}, registered "
                         f"{_ago(seen, now)}): {_message(item, now)}")
    delivered = {_text(tag): score for tag, score in client.zrange(UNACKED_INDEX, 0, -1, withscores=True)}
    for tag, raw in client.hgetall(UNACKED).items():
        record = _json(raw)
        if not isinstance(record, list) or len(record) != 3 or record[2] not in wanted:
            continue
        payload, _, queue = record
        lines.append(f"unacked from {queue} (tag {_text(tag)}, delivered {_ago(delivered.get(_text(tag)), now)}): "
                     f"{_message(json.dumps(payload), now)}")
    return lines + (_log_mentions(lines, logs) if logs is not None else [])


def _message(item: bytes | str, now: float) -> str:
    payload = _json(item)
    headers = payload.get("headers") if isinstance(payload, dict) else None
    if not isinstance(headers, dict):
        return f"an item that is no task message ({len(item)} bytes)"
    return (f"{headers.get('task')}[{headers.get('id')}], retries {headers.get('retries')}, "
            f"published {_ago(headers.get(PUBLISHED_HEADER), now)}")


def _log_mentions(lines: list[str], logs: Path) -> list[str]:
    """The last lines of every log under ``logs`` that name a task id of ``lines``."""
    ids = [line.split("[", 1)[1].split("]", 1)[0] for line in lines if "[" in line]
    out: list[str] = []
    for task_id in ids:
        if not task_id or task_id == "None":
            continue
        for log in sorted(logs.glob("*")):
            if log.is_file():
                hits = [line for line in log.read_text(errors="replace").splitlines() if task_id in line]
                out.extend(f"  {log.name}: {hit[:300]}" for hit in hits[-LOG_LINES:])
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
