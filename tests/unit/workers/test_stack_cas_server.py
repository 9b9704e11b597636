"""When ``shardfuse up`` runs the object store: only for an ``s3://`` CAS whose endpoint is ``http://`` on this
machine, with a port; and how it recognises the server it started (no process is started here)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.workers.stack import cas_server, launcher
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.object_store import ObjectStorePorts, weed_command
from shardfuse.workers.stack.state import ComponentState


def settings(url: str, endpoint: str) -> Settings:
    return Settings(cas={"url": url, "s3": {"endpoint_url": endpoint}})


@pytest.mark.parametrize(("endpoint", "host"), [
    ("http://127.0.0.1:18333", "127.0.0.1"),
    ("http://localhost:18333/", "127.0.0.1"),
    ("http://[::1]:18333", "::1"),
    ("http://127.0.0.2:18333", "127.0.0.2"),
])  # fmt: skip
def test_an_s3_cas_on_this_machine_is_the_stacks_to_run(endpoint: str, host: str) -> None:
    target = cas_server.embedded_target(settings("s3://shardfuse/cas", endpoint))
    assert target == cas_server.ObjectStoreTarget(host=host, port=18333)


@pytest.mark.parametrize(("url", "endpoint"), [
    ("", "http://127.0.0.1:18333"),                       # the default: a folder under data_dir
    ("file:///srv/cas", "http://127.0.0.1:18333"),
    ("s3://shardfuse/cas", ""),                           # AWS S3
    ("s3://shardfuse/cas", "http://minio.internal:9000"),  # another machine
    ("s3://shardfuse/cas", "https://127.0.0.1:9000"),      # TLS: someone else's store on loopback
])  # fmt: skip
def test_any_other_cas_starts_nothing(url: str, endpoint: str) -> None:
    assert cas_server.embedded_target(settings(url, endpoint)) is None


def test_a_loopback_endpoint_without_a_port_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="port"):
        cas_server.embedded_target(settings("s3://shardfuse/cas", "http://127.0.0.1"))


def test_the_recorded_server_is_recognised_by_its_command_line(tmp_path: Path) -> None:
    def command(port: int) -> str:
        return " ".join(weed_command(Path("/venv/bin/weed"), data_dir=tmp_path, host="127.0.0.1",
                                     ports=ObjectStorePorts(port), identities=tmp_path / "ids.json"))  # fmt: skip

    marks = cas_server.cmdline_marks(cas_server.ObjectStoreTarget(host="127.0.0.1", port=18333))
    assert all(mark in command(18333) for mark in marks)
    assert not all(mark in command(18343) for mark in marks)


def test_a_server_still_running_on_another_port_is_refused(tmp_path: Path) -> None:
    # This very process stands in for a live server recorded with another port's marks.
    running = ComponentState(pid=os.getpid(), log=tmp_path / "log", started_at=psutil.Process().create_time(),
                             cmdline_marks=())  # fmt: skip
    target = cas_server.ObjectStoreTarget(host="127.0.0.1", port=18333)
    with pytest.raises(StackError, match="shardfuse down"):
        cas_server.refuse_moved(running, target)
    cas_server.refuse_moved(None, target)  # nothing recorded: nothing to refuse


def test_its_data_lives_under_the_data_dir_and_it_starts_before_the_workers(tmp_path: Path) -> None:
    assert StackLayout(tmp_path).objects_dir == tmp_path / "objects"
    order = launcher.COMPONENTS
    assert order.index(cas_server.NAME) < min(order.index(name) for name in launcher.CELERY)
