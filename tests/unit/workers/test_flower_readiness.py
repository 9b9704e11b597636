"""Flower's readiness probe against something that is not Flower on its port."""

from __future__ import annotations

import socket
import threading

from shardfuse.workers.stack.celery_processes import flower_ready


def test_a_non_http_server_on_flowers_port_is_not_ready_rather_than_an_error() -> None:
    # Seen in a test session: a Redis given the same port answered the probe with "-ERR ..." (http.client's
    # BadStatusLine), which escaped the probe and failed `up` with a traceback instead of Flower's own error.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer_like_redis() -> None:  # the first probe is answered so, and the second is never made
            conn, _ = server.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"-ERR wrong number of arguments for 'get' command\r\n")

        thread = threading.Thread(target=answer_like_redis, daemon=True)
        thread.start()
        assert flower_ready(f"http://127.0.0.1:{port}/", user="flower", password="secret") is False
        thread.join(timeout=5)
