"""The embedded stack's ports: which of them shardfuse may choose, and the choice recorded in
``<data_dir>/stack-ports.json``.

A port the user did not set (``broker.url``, ``postgres.dsn``, ``stack.flower_port``, ``stack.api_port``,
``stack.metrics_port`` at their defaults) is the stack's to choose: the first ``up`` of a data dir keeps the
default if it is free and takes a free one otherwise (:mod:`shardfuse.workers.stack.ports`), and records what
it took here. Every process that resolves its settings with
:func:`~shardfuse.pipeline.config.settings.load_settings` with that data dir (the CLI, a worker started by
hand) then gets the same addresses with no extra step, and the processes ``up`` starts get them in the
settings it hands them. A port the user set is never moved: if it is taken, ``up`` says by whom.

"At its default" is judged by value: a URL or DSN that is the default one (its password aside) at the
default port or at the port recorded here. So two stacks, ``--data-dir A`` and ``--data-dir B``, both with
default settings, run side by side; a third setting written in a file that names the default spelling
explicitly is treated the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import psycopg.conninfo

from shardfuse.pipeline.config.stores import BrokerSettings, PostgresSettings
from shardfuse.pipeline.config.workers import StackSettings
from shardfuse.pipeline.core.errors import ConfigurationError

if TYPE_CHECKING:
    from shardfuse.pipeline.config.settings import Settings

PORTS_FILE = "stack-ports.json"
FORMAT_VERSION = 1


class PortSlot(StrEnum):
    """A port (or run of ports) of the embedded stack that shardfuse may choose."""

    REDIS = "redis"
    POSTGRES = "postgres"
    FLOWER = "flower"
    API = "api"
    METRICS = "metrics"  # the first of one port per worker pool


SETTING_NAMES: dict[PortSlot, str] = {
    PortSlot.REDIS: "broker.url", PortSlot.POSTGRES: "postgres.dsn", PortSlot.FLOWER: "stack.flower_port",
    PortSlot.API: "stack.api_port", PortSlot.METRICS: "stack.metrics_port",
}  # fmt: skip


def _default(model: type[BrokerSettings | PostgresSettings | StackSettings], field: str) -> object:
    return model.model_fields[field].default


DEFAULT_BROKER_URL = str(_default(BrokerSettings, "url"))
DEFAULT_RESULT_BACKEND = str(_default(BrokerSettings, "result_backend"))
DEFAULT_DSN = str(_default(PostgresSettings, "dsn"))


def default_port(slot: PortSlot) -> int:
    """The port ``slot`` has when nothing is set."""
    if slot is PortSlot.REDIS:
        return urlsplit(DEFAULT_BROKER_URL).port or 0
    if slot is PortSlot.POSTGRES:
        return int(psycopg.conninfo.conninfo_to_dict(DEFAULT_DSN).get("port") or 0)
    return int(str(_default(StackSettings, f"{slot.value}_port")))


def ports_file(data_path: Path) -> Path:
    return data_path / PORTS_FILE


def load_stack_ports(data_path: Path) -> dict[PortSlot, int]:
    """The ports ``up`` chose for the stack in ``data_path`` ({} if none were recorded); ConfigurationError
    if the file is damaged."""
    path = ports_file(data_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return {}
    except OSError as exc:
        raise ConfigurationError(f"cannot read the stack's ports in {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
        return {PortSlot(name): _port(value) for name, value in data["ports"].items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigurationError(f"the stack's ports in {path} are damaged ({exc}); run `shardfuse down`, delete "
                                 "the file and run `shardfuse up`: it chooses them again") from None


def save_stack_ports(data_path: Path, ports: Mapping[PortSlot, int]) -> None:
    """Record ``ports`` for the stack in ``data_path`` (atomically; the caller holds the data dir's lock)."""
    text = json.dumps({"version": FORMAT_VERSION, "ports": {slot.value: port for slot, port in sorted(
        ports.items(), key=lambda item: item[0].value)}}, indent=1) + "\n"
    path = ports_file(data_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(name, 0o644)  # addresses, no secrets: every local user of the stack may read them
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        raise


def with_stack_ports(settings: Settings) -> Settings:
    """``settings`` with the ports recorded for its data dir wherever the user left the port at its default."""
    recorded = load_stack_ports(settings.data_path)
    return apply_stack_ports(settings, recorded, recorded=recorded) if recorded else settings


def chosen_ports(settings: Settings, *, recorded: Mapping[PortSlot, int]) -> dict[PortSlot, int]:
    """The slots of ``settings`` that are the stack's to choose (left at their default, or at the port recorded
    for them), each with the port it has now. A slot set to 0 (none) is not among them."""
    found: dict[PortSlot, int] = {}
    for slot in PortSlot:
        allowed = {default_port(slot), recorded.get(slot, 0)} - {0}
        port = _current_auto_port(settings, slot)
        if port is not None and port in allowed:
            found[slot] = port
    return found


def apply_stack_ports(settings: Settings, ports: Mapping[PortSlot, int], *,
                      recorded: Mapping[PortSlot, int]) -> Settings:
    """``settings`` with each slot of ``ports`` moved to its port, where that slot is the stack's to choose."""
    movable = chosen_ports(settings, recorded=recorded)
    update = {slot: port for slot, port in ports.items() if slot in movable and movable[slot] != port}
    if not update:
        return settings
    broker, postgres, stack = settings.broker, settings.postgres, settings.stack
    if PortSlot.REDIS in update:
        old, new = movable[PortSlot.REDIS], update[PortSlot.REDIS]
        backend = settings.broker.result_backend
        if _strip_password(backend) == _with_port(DEFAULT_RESULT_BACKEND, old):
            backend = _with_port(backend, new)
        broker = broker.model_copy(update={"url": _with_port(broker.url, new), "result_backend": backend})
    if PortSlot.POSTGRES in update:
        postgres = postgres.model_copy(update={"dsn": _dsn_with_port(postgres.dsn, update[PortSlot.POSTGRES])})
    stack_update = {f"{slot.value}_port": port for slot, port in update.items()
                    if slot in (PortSlot.FLOWER, PortSlot.API, PortSlot.METRICS)}
    if stack_update:
        stack = stack.model_copy(update=stack_update)
    return settings.model_copy(update={"broker": broker, "postgres": postgres, "stack": stack})


def _current_auto_port(settings: Settings, slot: PortSlot) -> int | None:
    """The port ``slot`` names, if its setting is the default one apart from the port (and the password)."""
    if slot is PortSlot.REDIS:
        url = _strip_password(settings.broker.url)
        port = _url_port(url)
        return port if port is not None and url == _with_port(DEFAULT_BROKER_URL, port) else None
    if slot is PortSlot.POSTGRES:
        if settings.postgres.shard_dsns:
            return None  # shards on DSNs of their own: the user laid the servers out
        return _dsn_auto_port(settings.postgres.dsn)
    port = int(getattr(settings.stack, f"{slot.value}_port"))
    return port or None


def _dsn_auto_port(dsn: str) -> int | None:
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        default = psycopg.conninfo.conninfo_to_dict(DEFAULT_DSN)
        port = int(params.pop("port", None) or 0)
    except (psycopg.ProgrammingError, ValueError):
        return None  # the settings' own checks say what is wrong with it
    params.pop("password", None)
    default.pop("port", None)
    return port if port and params == default else None


def _url_port(url: str) -> int | None:
    try:
        return urlsplit(url).port
    except ValueError:
        return None


def _strip_password(url: str) -> str:
    """``url`` without the password of its user info (the stack's generated one is filled in later)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))


def _with_port(url: str, port: int) -> str:
    """``url`` (``scheme://[userinfo@]host[:port]/…``) with ``port``."""
    parts = urlsplit(url)
    userinfo, at, host_port = parts.netloc.rpartition("@")
    host = host_port.rsplit(":", 1)[0] if not host_port.endswith("]") else host_port
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}:{port}"))


def _dsn_with_port(dsn: str, port: int) -> str:
    if urlsplit(dsn).scheme in ("postgres", "postgresql"):
        return _with_port(dsn, port)
    return psycopg.conninfo.make_conninfo(dsn, port=str(port))


def _port(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
        raise ValueError(f"{value!r} is not a port")
    return value
