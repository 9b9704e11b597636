"""Free loopback ports for servers the tests start."""

from __future__ import annotations

import random
import socket

# Below the kernel's ephemeral range (32768+), which concurrent clients and `bind(0)` draw from.
PORT_RANGE = (20000, 32768)


def free_port() -> int:
    for _ in range(100):
        port = random.randrange(*PORT_RANGE)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")
