"""The embedded stack's HTTP API process: what ``up`` runs, how ``down`` and ``status`` recognise it."""

from __future__ import annotations

import sys
from pathlib import Path

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.http import server
from shardfuse.workers.stack import api_process
from shardfuse.workers.stack.addresses import Endpoint
from shardfuse.workers.stack.state import ComponentState, StackState


def test_the_command_runs_the_server_module_on_the_stacks_address() -> None:
    endpoint = Endpoint("127.0.0.1", 15560)
    command = api_process.command(endpoint)
    assert command == [sys.executable, "-m", server.MODULE, "--host=127.0.0.1", "--port=15560"]
    assert all(any(mark in part for part in command) for mark in api_process.marks(endpoint))
    assert api_process.url(Endpoint("::1", 8)) == "http://[::1]:8"


def test_status_shows_the_url_only_of_an_api_up_started(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, stack={"api_port": 18080})
    state = StackState(data_dir=tmp_path, broker_url="redis://127.0.0.1:6379/0", flower_url="http://x/",
                       postgres_dsn="postgresql://x")
    assert api_process.recorded_url(settings, None) is None
    assert api_process.recorded_url(settings, state) is None  # up started no API
    started = state.with_component("api", ComponentState(pid=1, log=tmp_path / "api.log", started_at=0.0))
    assert api_process.recorded_url(settings, started) == "http://127.0.0.1:18080"
    assert api_process.recorded_url(Settings(data_dir=tmp_path, stack={"api_port": 0}), started) is None


def test_nothing_answers_healthz_on_a_closed_port() -> None:
    assert not api_process.healthy("http://127.0.0.1:9")
