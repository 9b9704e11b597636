"""A pool's ``/metrics`` over HTTP, served by ``prometheus_client`` on a daemon thread of the pool's main
process (the process that does not fork away, and that outlives its children)."""

from __future__ import annotations

import logging
import socket
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)
# Addresses meaning "every interface": the URL others use names this host instead.
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class MetricsServer:
    """Serves ``registry`` at ``http://<address>:<port>/metrics`` from the moment it is built (port 0: one
    the system picks). ``OSError`` when the port cannot be bound."""

    def __init__(self, registry: CollectorRegistry, *, address: str, port: int) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=address, registry=registry)
        self.address = address
        self.port = int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The URL other machines reach it at (this host's address when it listens on every interface)."""
        host = advertised_host(self.address)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/metrics"

    @property
    def listening(self) -> bool:
        """Whether this process holds the listening socket."""
        return self._server.socket.fileno() != -1

    def close_in_child(self) -> None:
        """In a process forked after the server started: let go of the inherited listening socket, so that
        the port is free again when the main process stops even if children outlive it. The parent's
        server is untouched (the child closes its own copy of the descriptor only)."""
        self._server.socket.close()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def advertised_host(address: str) -> str:
    """The host part of the URL others use for a server bound to ``address``: the address itself, or for a
    wildcard this host's address as its resolver gives it (the pod's IP in Kubernetes, the container's in
    Compose), loopback if it has none."""
    if address not in _WILDCARDS:
        return address
    try:
        host = socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        log.warning("cannot resolve this host's name (%s): announcing the metrics endpoint on loopback", exc)
        return "127.0.0.1"
    return host
