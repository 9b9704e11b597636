"""Serving the HTTP API with uvicorn: ``shardfuse api`` in the foreground, and the embedded stack's API process
(``python -m shardfuse.workers.http.server --host=H --port=P``, started by
:mod:`shardfuse.workers.stack.api_process` with the launcher's settings handed over as a file,
:mod:`shardfuse.pipeline.config.handoff`).

One process per server: it scales out as more processes or replicas (their rate limits are shared in Redis);
within one, searches wait on the query workers in a thread pool (``api.search_concurrency`` at a time).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import uvicorn

from shardfuse.pipeline.config.handoff import process_settings
from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.http.app import create_app

MODULE = "shardfuse.workers.http.server"


def serve(settings: Settings, *, host: str, port: int) -> None:
    """Serve until interrupted (SIGINT/SIGTERM: uvicorn finishes the requests in flight, then returns)."""
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info", proxy_headers=False,
                server_header=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=MODULE, description="the HTTP API, with the launcher's settings")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    serve(process_settings(os.environ), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
