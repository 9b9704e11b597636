"""The recorded stack state: JSON round trip, atomic writes, and telling a live process from a reused pid."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from shardfuse.workers.stack import ComponentState, StackError, StackState
from shardfuse.workers.stack.state import load_state, remove_state, save_state


def _me(**changes: object) -> ComponentState:
    """A component record describing this very test process."""
    me = psutil.Process()
    fields: dict[str, object] = {
        "pid": me.pid,
        "log": Path("/tmp/me.log"),
        "started_at": me.create_time(),
        "cmdline_marks": ("python",),
    }
    fields.update(changes)
    return ComponentState(**fields)  # type: ignore[arg-type]


def _state(**components: ComponentState) -> StackState:
    return StackState(
        data_dir=Path("/data"),
        broker_url="redis://127.0.0.1:16379/0",
        flower_url="http://127.0.0.1:15555/",
        postgres_dsn="postgresql://postgres@127.0.0.1:15432/shardfuse",
        components=components,
    )


def test_round_trip(tmp_path: Path) -> None:
    state = _state(
        redis=ComponentState(pid=12, log=Path("/data/logs/redis.log"), started_at=1.5, cmdline_marks=("a", "b")),
        flower=ComponentState(pid=34, log=Path("/data/logs/flower.log"), started_at=2.0),
    )
    path = tmp_path / "run" / "stack.json"
    save_state(path, state)
    assert load_state(path) == state
    assert json.loads(path.read_text())["components"]["redis"]["pid"] == 12


def test_save_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    save_state(path, _state())
    save_state(path, _state(redis=_me()))
    assert [p.name for p in tmp_path.iterdir()] == ["stack.json"]


def test_missing_file_is_no_state(tmp_path: Path) -> None:
    assert load_state(tmp_path / "stack.json") is None
    remove_state(tmp_path / "stack.json")  # removing nothing is fine


def test_corrupt_file_is_a_stack_error(tmp_path: Path) -> None:
    path = tmp_path / "stack.json"
    path.write_text("{not json")
    with pytest.raises(StackError, match="unreadable"):
        load_state(path)


def test_a_running_process_is_alive() -> None:
    state = _state(me=_me())
    assert state.alive() == {"me": os.getpid()}
    assert state.dead() == []


def test_a_reused_pid_is_not_alive() -> None:
    # Same pid, but created at another time: the recorded process is gone and the pid was handed out again.
    reused = _me(started_at=psutil.Process().create_time() - 3600)
    assert not reused.is_alive()
    assert not reused.has_processes()  # and the stranger holding the pid is never a target


def test_a_pid_running_another_program_is_not_alive() -> None:
    assert not _me(cmdline_marks=("redis-server",)).is_alive()


def test_a_vanished_pid_is_not_alive() -> None:
    proc = psutil.Popen(["true"])
    proc.wait()
    gone = ComponentState(pid=proc.pid, log=Path("/tmp/x.log"), started_at=0.0)
    assert _state(gone=gone).dead() == ["gone"]


def test_with_and_without_return_copies() -> None:
    state = _state()
    added = state.with_component("redis", _me())
    assert "redis" not in state.components
    assert set(added.components) == {"redis"}
    assert added.without("redis").components == {}
    assert added.broker_url == state.broker_url
