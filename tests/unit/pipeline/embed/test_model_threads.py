"""Threads per forward pass of the local model: the process's cores shared by the passes that run at once."""

from __future__ import annotations

import os

import pytest

from shardfuse.pipeline.embed.providers.threads import available_cores, model_threads


def test_unset_uses_every_core_for_one_pass_at_a_time() -> None:
    assert model_threads(0, cores=2) == 2
    assert model_threads(0, cores=16, concurrent=1) == 16


def test_concurrent_passes_share_the_cores_and_keep_one_thread_each() -> None:
    assert model_threads(0, cores=8, concurrent=4) == 2
    assert model_threads(0, cores=2, concurrent=8) == 1  # never zero: ONNX Runtime would read 0 as "all cores"


def test_a_configured_count_wins() -> None:
    assert model_threads(3, cores=2, concurrent=4) == 3


def test_nonsense_is_refused() -> None:
    for kwargs in ({"configured": -1, "cores": 2}, {"configured": 0, "cores": 0}, {"configured": 0, "cores": 2,
                                                                                    "concurrent": 0}):
        with pytest.raises(ValueError):
            model_threads(**kwargs)  # type: ignore[arg-type]


def test_available_cores_follow_the_affinity() -> None:
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    assert available_cores() == len(os.sched_getaffinity(0)) >= 1
