"""``up`` settles its ports before anything starts: a default port another program holds moves to a free one (and
stays there for the data dir), a port the user set and another holds is a clear error, the stack's own running
processes keep theirs. Real sockets on loopback hold the ports."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.config.stack_ports import PortSlot, load_stack_ports, save_stack_ports
from shardfuse.workers.stack import processes
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.ports import can_bind, settle_ports
from shardfuse.workers.stack.state import ComponentState, StackState
from tests.integration.ports import free_port

# No SHARDFUSE_* variable of the shell running the tests, and a HOME of its own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_settings_env")


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    """Listening sockets the test opens: other programs holding ports."""
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def _hold(sockets: list[socket.socket], port: int) -> None:
    sockets.append(socket.create_server(("127.0.0.1", port)))


def _settle(settings: Settings, state: StackState | None = None, lines: list[str] | None = None) -> Settings:
    return settle_ports(settings, layout=StackLayout(settings.data_path), state=state,
                        progress=(lines if lines is not None else []).append)


def _ports(settings: Settings) -> dict[str, int]:
    return {"redis": int(settings.broker.url.rsplit(":", 1)[1].split("/")[0]),
            "postgres": int(settings.postgres.dsn.rsplit(":", 1)[1].split("/")[0]),
            "flower": settings.stack.flower_port, "api": settings.stack.api_port,
            "metrics": settings.stack.metrics_port}


def test_two_data_dirs_with_default_ports_get_ports_that_do_not_meet(tmp_path: Path,
                                                                      held: list[socket.socket]) -> None:
    first = _settle(load_settings(data_dir=tmp_path / "a"))
    a = _ports(first)
    # Stack A now runs: its ports (and its four metrics ports) are held.
    for port in [*a.values(), *range(a["metrics"] + 1, a["metrics"] + 4)]:
        _hold(held, port)
    lines: list[str] = []
    second = _settle(load_settings(data_dir=tmp_path / "b"), lines=lines)
    b = _ports(second)
    a_ports = {*a.values(), *range(a["metrics"], a["metrics"] + 4)}
    b_ports = {*b.values(), *range(b["metrics"], b["metrics"] + 4)}
    assert not a_ports & b_ports and len(b_ports) == 8
    assert all(can_bind("127.0.0.1", port) for port in b_ports)
    assert any(f"pid {os.getpid()}" in line and "recorded for this data dir" in line for line in lines), lines
    # Every later command of data dir B resolves B's ports; A's keep theirs.
    assert _ports(load_settings(data_dir=tmp_path / "b")) == b
    assert _ports(load_settings(data_dir=tmp_path / "a")) == a
    assert load_stack_ports(tmp_path / "b")[PortSlot.FLOWER] == b["flower"]


def test_a_port_the_user_set_and_another_holds_is_an_error_naming_it(tmp_path: Path,
                                                                      held: list[socket.socket]) -> None:
    port = free_port()
    _hold(held, port)
    settings = load_settings(data_dir=tmp_path, stack={"flower_port": port})
    with pytest.raises(StackError) as raised:
        _settle(settings)
    message = str(raised.value)
    assert f"cannot start Flower: 127.0.0.1 port {port} (stack.flower_port) is already in use" in message
    assert f"held by pid {os.getpid()}" in message and "set stack.flower_port to a free port" in message
    redis_port = free_port()
    _hold(held, redis_port)
    broker = {"url": f"redis://127.0.0.1:{redis_port}/0"}
    with pytest.raises(StackError, match=rf"Redis: 127.0.0.1 port {redis_port} \(broker.url\) is already in use"):
        _settle(load_settings(data_dir=tmp_path, broker=broker))


def test_two_parts_of_one_stack_set_to_one_port_are_an_error(tmp_path: Path) -> None:
    port = free_port()
    settings = load_settings(data_dir=tmp_path, stack={"flower_port": port, "api_port": port})
    with pytest.raises(StackError, match=rf"port {port} \(stack.(api|flower)_port\) is already in use, claimed by"):
        _settle(settings)


def test_a_default_port_moves_off_a_port_the_user_gave_another_part(tmp_path: Path) -> None:
    settled = _settle(load_settings(data_dir=tmp_path, stack={"flower_port": 15560}))  # the API's default
    assert settled.stack.flower_port == 15560 and settled.stack.api_port != 15560


def test_the_stacks_own_running_processes_keep_their_ports(tmp_path: Path, held: list[socket.socket]) -> None:
    port = free_port()
    _hold(held, port)  # held by this process, which the state below records as the stack's Flower
    me = ComponentState(pid=os.getpid(), log=tmp_path / "flower.log",
                        started_at=processes.process_started_at(os.getpid()))
    state = StackState(data_dir=tmp_path, broker_url="", flower_url="", postgres_dsn="", components={"flower": me})
    settings = load_settings(data_dir=tmp_path, stack={"flower_port": port})
    assert _settle(settings, state=state).stack.flower_port == port
    # A port shardfuse chose earlier (recorded) is not moved either while the stack's own process holds it.
    save_stack_ports(tmp_path / "auto", {PortSlot.FLOWER: port})
    auto = load_settings(data_dir=tmp_path / "auto")
    assert auto.stack.flower_port == port
    state = StackState(data_dir=tmp_path / "auto", broker_url="", flower_url="", postgres_dsn="",
                       components={"flower": me})
    assert _settle(auto, state=state).stack.flower_port == port
    # ...while one another program holds moves.
    assert _settle(auto).stack.flower_port != port


def test_only_the_ports_of_the_components_started_are_checked(tmp_path: Path, held: list[socket.socket]) -> None:
    # A second node starts its PostgreSQL alone against the Redis a first node serves (tests/support/multi_node.py):
    # that Redis port, set by the user and held, is not this call's to check, nor to move.
    redis_port, pg_port = free_port(), free_port()
    _hold(held, redis_port)
    settings = load_settings(data_dir=tmp_path, broker={"url": f"redis://127.0.0.1:{redis_port}/0"},
                             postgres={"dsn": f"postgresql://postgres@127.0.0.1:{pg_port}/shardfuse"})
    node = settle_ports(settings, layout=StackLayout(settings.data_path), state=None, progress=[].append,
                        components={"postgres"})
    assert _ports(node)["redis"] == redis_port and _ports(node)["postgres"] == pg_port
    with pytest.raises(StackError, match=rf"port {redis_port} \(broker.url\) is already in use"):
        settle_ports(settings, layout=StackLayout(settings.data_path), state=None, progress=[].append,
                     components={"redis", "postgres"})
    _hold(held, pg_port)  # ...while the component it does start is still checked
    with pytest.raises(StackError, match=rf"port {pg_port} \(postgres.dsn\) is already in use"):
        settle_ports(settings, layout=StackLayout(settings.data_path), state=None, progress=[].append,
                     components={"postgres"})
