"""Probes of our own loopback processes ignore a configured HTTP proxy (a proxy cannot reach our 127.0.0.1)."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from shardfuse.pipeline.core.loopback_http import open_url


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def local_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy nobody listens on (port 9, discard), as on a machine configured for a proxy it cannot reach.
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


def test_a_loopback_url_is_fetched_directly_despite_a_proxy(local_server: str, dead_proxy: None) -> None:
    # The trap: plain urllib asks the proxy for 127.0.0.1. (A fresh opener: urlopen's global one would keep the
    # dead proxy for every later test of the session.)
    with pytest.raises(urllib.error.URLError):
        urllib.request.build_opener().open(local_server, timeout=2)
    with open_url(local_server, timeout=2) as response:
        assert response.status == 200 and response.read() == b"ok"
    with open_url(urllib.request.Request(local_server), timeout=2) as response:
        assert response.status == 200


def test_another_host_still_goes_through_the_proxy(dead_proxy: None) -> None:
    with pytest.raises(urllib.error.URLError):  # refused by the dead proxy, not resolved or fetched directly
        open_url("http://metrics.example.invalid:9809/metrics", timeout=2)
