"""What a worker takes off a queue: the one check every received item passes before kombu and Celery see it.

Anyone who can write to the broker (every publisher and search client can) can put any bytes on a queue.
kombu and Celery trust what they receive: a JSON object that is not a whole kombu envelope raises
``KeyError`` inside the delivery, which kombu counts as a connection error (the worker reconnects and the
message comes back at the head of the queue, forever); deep nesting raises ``RecursionError`` in the JSON
decoder and kills the worker at every start; a ``compression`` header makes kombu inflate the body; a
header named like an attribute of Celery's task context overwrites it. :func:`check_envelope` accepts
exactly the messages shardfuse's own senders put on the lists (kombu's Redis transport, JSON only, Celery's
task protocol 2 with keyword arguments only) and refuses anything else with a one-line reason, raising
:class:`~shardfuse.pipeline.core.errors.UnreadableMessageError` and nothing else. Pure: no I/O.

A received item looks like this (the body base64 of ``[args, kwargs, embed]``)::

    {"body": "W1tdLCB7...", "content-encoding": "utf-8", "content-type": "application/json",
     "headers": {"lang": "py", "task": "shardfuse.search", "id": "…", "eta": null, "expires": "…", ...},
     "properties": {"body_encoding": "base64", "delivery_tag": "…", "priority": 0,
                    "delivery_info": {"exchange": "", "routing_key": "query"}, ...}}
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from celery.app.task import Context

from shardfuse.pipeline.core import json_depth
from shardfuse.pipeline.core.errors import UnreadableMessageError
from shardfuse.workers.names import PUBLISHED_HEADER, TASK_QUEUES

CONTENT_TYPE = "application/json"  # JSON only (shardfuse.workers.broker.serialization)
# The tasks each of shardfuse's queues runs; any other queue (a reply queue) carries plain kombu messages.
QUEUE_TASKS: Mapping[str, frozenset[str]] = {
    queue.value: frozenset(task.value for task, routed in TASK_QUEUES.items() if routed is queue)
    for queue in set(TASK_QUEUES.values())
}

# The embed part of a task body: our senders never chain, link or chord tasks.
_EMBED_KEYS = frozenset({"callbacks", "errbacks", "chain", "chord"})


def _decode_json(raw: bytes, what: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableMessageError(f"{what} is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise UnreadableMessageError(f"{what} is empty")
    try:
        return json_depth.loads(text)
    except json_depth.TooDeepError as exc:
        raise UnreadableMessageError(f"{what} {exc}") from None
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated")
        raise UnreadableMessageError(f"{what} is {'truncated' if truncated else 'not'} JSON "
                                     f"({exc.msg} at char {exc.pos})") from None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _field(mapping: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in mapping:
        raise UnreadableMessageError(f"{where} has no {key!r}")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise UnreadableMessageError(f"{where}[{key!r}] is a {_kind(value)}, not a {kind.__name__}")
    return value


# Header checks: a value Celery reads must have the type Celery expects.
def _is_text(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _is_count(v: Any) -> bool:
    return v is None or isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_seconds(v: Any) -> bool:
    return v is None or isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _is_time(v: Any) -> bool:
    if v is None:
        return True
    if not isinstance(v, str):
        return False
    try:
        datetime.fromisoformat(v)
    except ValueError:
        return False
    return True


_HEADERS: dict[str, Callable[[Any], bool]] = {
    "lang": lambda v: v in (None, "py"),
    "id": lambda v: isinstance(v, str) and bool(v),
    "task": lambda v: isinstance(v, str),
    "shadow": _is_text, "group": _is_text, "root_id": _is_text, "parent_id": _is_text,
    "argsrepr": _is_text, "kwargsrepr": _is_text, "origin": _is_text,
    "eta": _is_time, "expires": _is_time,
    "group_index": _is_count, "retries": _is_count, "replaced_task_nesting": _is_count,
    "timelimit": lambda v: v is None or isinstance(v, list) and len(v) == 2 and all(map(_is_seconds, v)),
    "ignore_result": lambda v: v is None or isinstance(v, bool),
    "stamped_headers": lambda v: v is None or isinstance(v, list) and not v,
    "stamps": lambda v: v is None or isinstance(v, dict) and not v,
    "redelivered": lambda v: isinstance(v, bool),  # kombu marks a message it puts back
    PUBLISHED_HEADER: _is_seconds,
}
# Other headers are inert to Celery, except names its task context holds (a header sets the attribute of
# the same name: ``update``, ``is_eager``, ``hostname``...) and kombu's ``compression`` (inflates the body).
_RESERVED = frozenset({*(name for name in vars(Context) if not name.startswith("__")), "compression"})


def _check_headers(headers: dict[str, Any], tasks: Collection[str] | None) -> None:
    for name, value in headers.items():
        check = _HEADERS.get(name)
        if check is None and (name in _RESERVED or name.startswith("_")):
            raise UnreadableMessageError(f"header {name!r} is not one a task message carries")
        if check is not None and not check(value):
            raise UnreadableMessageError(f"header {name!r} has an invalid value ({_kind(value)})")
    if tasks is None:
        return
    task = _field(headers, "task", str, "headers")
    _field(headers, "id", str, "headers")
    if task not in tasks:
        raise UnreadableMessageError(f"task {task[:100]!r} is not one this queue runs ({', '.join(sorted(tasks))})")


def _check_properties(properties: dict[str, Any], queue: str | None) -> None:
    if properties.get("body_encoding") != "base64":
        raise UnreadableMessageError(f"body encoding {str(properties.get('body_encoding'))[:40]!r} is not base64")
    info = _field(properties, "delivery_info", dict, "properties")
    routing_key = _field(info, "routing_key", str, "delivery_info")
    exchange = _field(info, "exchange", str, "delivery_info")
    if queue is not None and (routing_key != queue or exchange not in ("", queue)):
        raise UnreadableMessageError(f"routed to {exchange[:40]!r}/{routing_key[:40]!r}, not to queue {queue!r}")
    if not isinstance(info.get("redelivered", False), bool):
        raise UnreadableMessageError("delivery_info['redelivered'] is not a boolean")
    priority = properties.get("priority")
    if priority is not None and not (_is_count(priority) and priority <= 255):
        raise UnreadableMessageError("properties['priority'] is not an integer from 0 to 255")
    for name in ("correlation_id", "reply_to"):
        if not _is_text(properties.get(name)):
            raise UnreadableMessageError(f"properties[{name!r}] is not a string")


def _check_task_body(body: bytes) -> None:
    decoded = _decode_json(body, "the body")
    if not (isinstance(decoded, list) and len(decoded) == 3):
        raise UnreadableMessageError("the body is not a task body [args, kwargs, embed]")
    args, kwargs, embed = decoded
    if not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(embed, dict):
        raise UnreadableMessageError(f"the body is [{_kind(args)}, {_kind(kwargs)}, {_kind(embed)}], not "
                                     "[list, dict, dict]")
    if args:
        raise UnreadableMessageError(f"{len(args)} positional argument(s): shardfuse tasks take keyword "
                                     "arguments only")
    if "self" in kwargs:  # Celery passes the bound task as ``self``: a call that fails before our code runs
        raise UnreadableMessageError("a keyword argument named 'self'")
    if set(embed) - _EMBED_KEYS or any(value is not None for value in embed.values()):
        raise UnreadableMessageError("the body links other tasks (callbacks, errbacks, chain or chord)")


def _check(item: bytes, *, max_bytes: int, tasks: Collection[str] | None, queue: str | None) -> dict[str, Any]:
    if len(item) > max_bytes:
        raise UnreadableMessageError(f"{len(item)} bytes, more than broker.max_message_bytes ({max_bytes})")
    payload = _decode_json(item, "the message")
    if not isinstance(payload, dict):
        raise UnreadableMessageError(f"the message is a JSON {_kind(payload)}, not an object")
    body = _field(payload, "body", str, "the message")
    content_type = _field(payload, "content-type", str, "the message")
    if content_type != CONTENT_TYPE:
        raise UnreadableMessageError(f"content type {content_type[:60]!r} (only {CONTENT_TYPE})")
    if _field(payload, "content-encoding", str, "the message").lower() not in ("utf-8", "utf8"):
        raise UnreadableMessageError(f"content encoding {payload['content-encoding'][:40]!r} (only utf-8)")
    _check_headers(_field(payload, "headers", dict, "the message"), tasks)
    _check_properties(_field(payload, "properties", dict, "the message"), queue if tasks is not None else None)
    try:
        raw_body = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise UnreadableMessageError("the body is not base64") from None
    if tasks is not None:
        _check_task_body(raw_body)
    return payload


def check_envelope(item: bytes, *, max_bytes: int, tasks: Collection[str] | None,
                   queue: str | None = None) -> dict[str, Any]:
    """The kombu payload of ``item``, received from a queue, or :class:`UnreadableMessageError` saying why it
    is none a worker can run.

    ``tasks``: the task names ``queue`` runs; a task message of another task, with positional arguments or
    with a body that is not ``[args, kwargs, embed]`` is refused, as is one whose routing key is not
    ``queue``. None for a queue of plain kombu messages (a reply queue): only the envelope is checked.
    """
    try:
        return _check(item, max_bytes=max_bytes, tasks=tasks, queue=queue)
    except UnreadableMessageError:
        raise
    except Exception as exc:  # noqa: BLE001 - nothing from decoding hostile bytes may escape (MemoryError...)
        raise UnreadableMessageError(f"could not be checked: {type(exc).__name__}: {str(exc)[:200]}") from None
