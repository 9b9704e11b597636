"""A worker's warm-up when its stores are not up yet (shardfuse.workers.runtime): every piece is tried, what
failed is named and tried again in the background, and nothing escapes to stop the worker starting."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.names import Queue
from shardfuse.workers.runtime import WorkerRuntime
from tests.integration.ports import free_port


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[WorkerRuntime]:
    """A runtime whose PostgreSQL and Redis refuse connections (nothing listens on their ports)."""
    settings = Settings(
        data_dir=tmp_path,
        broker={"url": f"redis://127.0.0.1:{free_port()}/0", "result_backend": f"redis://127.0.0.1:{free_port()}/1"},
        postgres={"dsn": f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"},
        embedder={"provider": "hashing"},
    )
    built = WorkerRuntime(settings)
    yield built
    built.close()


def test_warm_up_tries_every_piece_and_names_those_not_ready(runtime: WorkerRuntime,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shardfuse.workers.runtime"):
        pending = runtime.warm_up([Queue.MAINTENANCE.value, Queue.INGEST.value])
    # PostgreSQL first in the list, yet the pieces after it were still built or tried.
    assert pending == ["stores", "shared_pool", "leases"]
    assert "_cas" in vars(runtime) and "_freshness" in vars(runtime)
    assert "stores not ready yet" in caplog.text and "unreachable" in caplog.text


def test_a_failed_warm_up_goes_on_in_the_background_until_the_runtime_closes(runtime: WorkerRuntime) -> None:
    thread = runtime.start_warm_up([Queue.MAINTENANCE.value])
    assert thread is not None and thread.is_alive()  # the call itself returned at once
    runtime.close()
    thread.join(timeout=20)
    assert not thread.is_alive()


def test_a_warm_up_with_nothing_missing_starts_no_thread(runtime: WorkerRuntime) -> None:
    assert runtime.start_warm_up(["some-queue-with-no-needs"]) is None
