"""Two embedded stacks on one machine, both with default ports: ``shardfuse --data-dir A up`` and
``shardfuse up --data-dir B`` (the option after the command, as a user types it). The second finds the
defaults taken and picks free ports, recorded in its data dir; every later command of either data dir resolves
its own stack's addresses: both index, both answer searches and status, neither sees the other's documents,
and ``down`` stops each."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from shardfuse.pipeline.config.stack_ports import load_stack_ports
from shardfuse.workers.stack.state import load_state
from tests.support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

# Settings that are no ports: a quick embedder and small pools (two stacks share this machine's cores).
QUIET = {
    "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
    "SHARDFUSE_WORKERS__EMBED_CONCURRENCY": "2",
    "SHARDFUSE_WORKERS__QUERY_CONCURRENCY": "2",
    "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
}


def _cli(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "shardfuse.workers.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"shardfuse {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture
def data_dirs() -> Iterator[tuple[Path, Path]]:
    # Not under pytest's tmp dir (see tests/integration/conftest.py: PostgreSQL must enter every parent).
    dirs = (Path(tempfile.mkdtemp(prefix="shardfuse-two-a-")), Path(tempfile.mkdtemp(prefix="shardfuse-two-b-")))
    yield dirs
    for folder in dirs:
        shutil.rmtree(folder, ignore_errors=True)


def _env() -> dict[str, str]:
    # Defaults for every port: no SHARDFUSE_* variable of this process leaks in.
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SHARDFUSE_")}, **QUIET}


def _pids(data_dir: Path) -> list[int]:
    state = load_state(data_dir / "run" / "stack.json")
    return [] if state is None else [comp.pid for comp in state.components.values()]


def test_two_stacks_with_default_ports_run_side_by_side(data_dirs: tuple[Path, Path]) -> None:
    env = _env()
    a, b = data_dirs
    started: list[Path] = []
    try:
        started.append(a)
        _cli(env, "--data-dir", str(a), "up", "--timeout", "300")
        started.append(b)
        up_b = _cli(env, "up", "--data-dir", str(b), "--timeout", "300")
        ports_a, ports_b = load_stack_ports(a), load_stack_ports(b)
        assert set(ports_a) == set(ports_b) == {"redis", "postgres", "flower", "api", "metrics"}

        def every_port(ports: dict[str, int]) -> set[int]:
            return {*ports.values(), *range(ports["metrics"], ports["metrics"] + 4)}

        assert not every_port(ports_a) & every_port(ports_b), (ports_a, ports_b)
        assert "is taken" in up_b and "recorded for this data dir" in up_b, up_b
        for folder, word in ((a, "alphastackterm"), (b, "betastackterm")):
            doc = folder / "notes" / f"{word}.md"
            doc.parent.mkdir()
            doc.write_text(f"# Notes\n\nThe {word} lives in this stack only.\n")
            _cli(env, "publish", str(doc.parent), "--zone", "two", "--data-dir", str(folder))
        for folder, mine, other in ((a, "alphastackterm", "betastackterm"), (b, "betastackterm", "alphastackterm")):
            _cli(env, "wait", "--timeout", "180", "--data-dir", str(folder))
            found = _cli(env, "search", mine, "--zone", "two", "--mode", "keyword", "--data-dir", str(folder))
            assert f"{mine}.md" in found, found
            assert f"{other}.md" not in _cli(env, "search", other, "--zone", "two", "--mode", "keyword",
                                              "--data-dir", str(folder))
            status = _cli(env, "status", "--data-dir", str(folder))
            assert f":{load_stack_ports(folder)['redis']}/" in status, status
    finally:
        leftovers: list[int] = []
        for folder in reversed(started):
            pids = _pids(folder)
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                _cli(env, "--data-dir", str(folder), "down", "--timeout", "60")
            leftovers += [pid for pid in pids if psutil.pid_exists(pid)
                          and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not leftovers, f"processes left behind after down: {leftovers}"
