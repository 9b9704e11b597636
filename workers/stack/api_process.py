"""The embedded stack's HTTP API process (``shardfuse api``, :mod:`shardfuse.workers.http`): started by ``up``
beside Flower on ``stack.api_port`` (loopback, as every address of the stack; 0: none), with the launcher's
settings handed over as a file, stopped by ``down``, and ready once ``/healthz`` answers."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.loopback_http import open_url
from shardfuse.workers.stack.addresses import Endpoint, StackAddresses
from shardfuse.workers.stack.launch import Launch, spawn
from shardfuse.workers.stack.state import StackState

NAME = "api"
# The API's entry point for a launcher (named, not imported: FastAPI and uvicorn load in the API process only).
MODULE = "shardfuse.workers.http.server"
HTTP_TIMEOUT_S = 2.0


def url(endpoint: Endpoint) -> str:
    """The API's base URL."""
    return f"http://{endpoint.url_host}:{endpoint.port}"


def command(endpoint: Endpoint, *, python: str = sys.executable) -> list[str]:
    """The API process's command line."""
    return [python, "-m", MODULE, f"--host={endpoint.host}", f"--port={endpoint.port}"]


def marks(endpoint: Endpoint) -> tuple[str, ...]:
    """Substrings of the running API's command line that identify it."""
    return (MODULE, f"--port={endpoint.port}")


def ensure(launch: Launch, addresses: StackAddresses, *, wanted: Collection[str], env: Mapping[str, str]) -> None:
    """Start the API unless it runs already, or is not wanted (``stack.api_port`` 0, or not among ``wanted``)."""
    endpoint = addresses.api
    if endpoint is None or NAME not in wanted:
        return
    launch.ensure(NAME, start=lambda: spawn(command(endpoint),
                                            log=launch.layout.log_file(NAME), env=dict(env), marks=marks(endpoint)))


def wait(launch: Launch, addresses: StackAddresses, *, wanted: Collection[str], deadline: float) -> None:
    """Block until the API (if it was wanted) answers ``/healthz``."""
    endpoint = addresses.api
    if endpoint is None or NAME not in wanted:
        return
    launch.wait(NAME, lambda: healthy(url(endpoint)), deadline=deadline)


def healthy(base_url: str) -> bool:
    """True if ``base_url`` serves our ``/healthz``."""
    try:
        with open_url(f"{base_url}/healthz", timeout=HTTP_TIMEOUT_S) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def recorded_url(settings: Settings, state: StackState | None) -> str | None:
    """Where the stack's API serves, if ``up`` started one (for ``status`` and ``up``'s last line)."""
    if state is None or NAME not in state.components:
        return None
    try:
        endpoint = StackAddresses.from_settings(settings).api
    except ConfigurationError:
        return None
    return url(endpoint) if endpoint else None
