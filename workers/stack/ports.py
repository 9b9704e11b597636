"""The ports ``shardfuse up`` binds, settled before anything starts: two stacks on one machine never fight over one.

Every address of the stack is a claim: Redis (``broker.url``), PostgreSQL (``postgres.dsn``), Flower
(``stack.flower_port``), the HTTP API (``stack.api_port``), the worker pools' metrics (``stack.metrics_port``
and one port per pool after it) and the object store (``cas.s3.endpoint_url``'s port and the seven after it).
A claim is fine if its ports are free or held by this data dir's own processes (a second ``up`` of a running
stack). Otherwise a port the user left at its default moves: the default if free, else the first free run
above it, recorded in the data dir (:mod:`shardfuse.pipeline.config.stack_ports`) so that every later command
resolves the same addresses. A port the user set is never moved: ``up`` stops with an error naming the port,
its setting and the process holding it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Collection
from dataclasses import dataclass, replace

import psutil

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.config.stack_ports import (
    SETTING_NAMES,
    PortSlot,
    apply_stack_ports,
    chosen_ports,
    default_port,
    load_stack_ports,
    save_stack_ports,
)
from shardfuse.workers.names import Queue
from shardfuse.workers.stack import (
    api_process,
    cas_server,
    celery_processes,
    object_store,
    postgres_server,
    redis_server,
)
from shardfuse.workers.stack.addresses import StackAddresses
from shardfuse.workers.stack.cas_server import ObjectStoreTarget
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.launch import Progress
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.state import StackState, load_state

# How far above its default a moved port is looked for.
SEARCH_SPAN = 2000
# The pools' metrics ports are claimed when any worker pool (``worker-<queue>``) starts.
ANY_WORKER = "worker-*"


@dataclass(frozen=True)
class Claim:
    """A run of ``count`` ports from ``first`` on ``host`` that one part of the stack listens on."""

    name: str  # what listens there, as a person would say it
    setting: str
    host: str
    first: int
    count: int = 1
    slot: PortSlot | None = None  # set when shardfuse may move it (the user left it at its default)
    component: str = ""  # the stack component (launcher.COMPONENTS) that listens there

    @property
    def ports(self) -> range:
        return range(self.first, self.first + self.count)


def claims(settings: Settings, *, object_store_port: int | None,
           components: Collection[str] | None = None) -> list[Claim]:
    """Every port the stack of ``settings`` listens on (``object_store_port``: the object store's S3 port, if
    it runs), or only those of ``components`` (``up``'s ``only``: a node that starts its PostgreSQL alone
    neither checks nor moves the Redis port another node serves)."""
    addresses = StackAddresses.from_settings(settings)
    movable = chosen_ports(settings, recorded=load_stack_ports(settings.data_path))
    host = addresses.redis.host
    found = [
        Claim("Redis", SETTING_NAMES[PortSlot.REDIS], host, addresses.redis.port, slot=PortSlot.REDIS,
              component=redis_server.NAME),
        Claim("PostgreSQL", SETTING_NAMES[PortSlot.POSTGRES], addresses.postgres.endpoint.host,
              addresses.postgres.endpoint.port, slot=PortSlot.POSTGRES, component=postgres_server.NAME),
        Claim("Flower", SETTING_NAMES[PortSlot.FLOWER], host, addresses.flower.port, slot=PortSlot.FLOWER,
              component=celery_processes.FLOWER),
    ]
    if addresses.api is not None:
        found.append(Claim("the HTTP API", SETTING_NAMES[PortSlot.API], host, addresses.api.port, slot=PortSlot.API,
                           component=api_process.NAME))
    if settings.stack.metrics_port:
        found.append(Claim("the worker pools' metrics", SETTING_NAMES[PortSlot.METRICS], host,
                           settings.stack.metrics_port, count=len(Queue), slot=PortSlot.METRICS,
                           component=ANY_WORKER))
    if object_store_port is not None:
        found.append(Claim("the object store", "cas.s3.endpoint_url", host, object_store_port,
                           count=object_store.PORTS_USED, component=cas_server.NAME))
    return [claim if claim.slot in movable else replace(claim, slot=None) for claim in found
            if components is None or _started_by(claim, components)]


def _started_by(claim: Claim, components: Collection[str]) -> bool:
    """True if one of ``components`` listens on ``claim``'s ports."""
    if claim.component == ANY_WORKER:
        workers = {celery_processes.worker_component(queue) for queue in Queue}
        return not workers.isdisjoint(components)
    return claim.component in components


def settle(settings: Settings, *, layout: StackLayout, progress: Progress, object_store: ObjectStoreTarget | None,
           only: Collection[str] | None = None) -> tuple[Settings, StackAddresses]:
    """``up``'s settings and addresses: every port of the components it starts (``only``; None: all) that the user
    left at its default moved off ports others hold (``object_store``: where the object store is to run, if it is)."""
    settings = settle_ports(settings, layout=layout, state=load_state(layout.state_file), progress=progress,
                            object_store_port=object_store.port if object_store else None, components=only)
    return settings, StackAddresses.from_settings(settings)


def settle_ports(settings: Settings, *, layout: StackLayout, state: StackState | None, progress: Progress,
                 object_store_port: int | None = None, components: Collection[str] | None = None) -> Settings:
    """``settings`` with every port the user left at its default moved off ports others hold, the choice
    recorded in the data dir. StackError naming the port, its setting and its holder if a port the user set
    is taken. Call it holding the data dir's lock, before anything starts."""
    wanted = claims(settings, object_store_port=object_store_port, components=components)
    probe = _Probe(ours=_own_pids(settings, layout=layout, state=state))
    moving: list[Claim] = []
    for claim in sorted(wanted, key=lambda c: c.slot is not None):  # the user's ports first
        busy = probe.busy(claim)
        if busy and claim.slot is None:
            raise StackError(probe.taken_message(claim, busy))
        if busy:
            moving.append(claim)
        else:
            probe.reserve(claim)
    chosen = {claim.slot: claim.first for claim in wanted if claim.slot is not None and claim not in moving}
    for claim in moving:
        assert claim.slot is not None
        moved = replace(claim, first=probe.free_run(claim))
        progress(f"shardfuse stack: {claim.host} port {claim.first} for {claim.name} ({claim.setting}) is taken, "
                 f"{probe.holders_text(claim)}; using {moved.first} (recorded for this data dir)")
        probe.reserve(moved)
        chosen[claim.slot] = moved.first
    recorded = load_stack_ports(settings.data_path)
    if chosen and chosen != {slot: port for slot, port in recorded.items() if slot in chosen}:
        save_stack_ports(settings.data_path, {**recorded, **chosen})
    return apply_stack_ports(settings, chosen, recorded=recorded)


class _Probe:
    """Which ports are free, this stack's own, or claimed already by another part of the stack being settled."""

    def __init__(self, *, ours: Collection[int]) -> None:
        self._ours = ours
        self._reserved: dict[int, str] = {}  # port -> the name of the claim that holds it
        self._listeners: dict[int, set[int | None]] | None = None

    def reserve(self, claim: Claim) -> None:
        self._reserved.update(dict.fromkeys(claim.ports, claim.name))

    def busy(self, claim: Claim) -> list[int]:
        """The ports of ``claim`` another part of this stack claimed, or a process not of this stack holds."""
        return [port for port in claim.ports
                if port in self._reserved or (not can_bind(claim.host, port) and not self._ours_hold(port))]

    def free_run(self, claim: Claim) -> int:
        """The default port of the claim's slot if its run is free, else the first free run above it."""
        assert claim.slot is not None
        start = default_port(claim.slot)
        candidates: list[int] = [start, *range(start + 1, min(start + SEARCH_SPAN, 65536 - claim.count))]
        for first in candidates:
            if not self.busy(replace(claim, first=first)):
                return first
        raise StackError(f"no {claim.count} free port(s) for {claim.name} on {claim.host} in "
                         f"{start}..{start + SEARCH_SPAN}; set {claim.setting} to a free port")

    def holders_text(self, claim: Claim) -> str:
        """Who holds the ports of ``claim``: a process, or another part of this stack."""
        inside = sorted({self._reserved[port] for port in claim.ports if port in self._reserved})
        if inside:
            return "claimed by " + " and ".join(inside) + " of this stack"
        holders = {pid for port in claim.ports for pid in self._holders(port)}
        described = [_describe(pid) for pid in sorted(holders, key=lambda pid: pid or 0)]
        return "held by " + ", ".join(described) if described else "in use"

    def taken_message(self, claim: Claim, busy: list[int]) -> str:
        which = f"port {busy[0]}" if len(busy) == 1 else f"ports {busy}"
        return (f"cannot start {claim.name}: {claim.host} {which} ({claim.setting}) is already in use, "
                f"{self.holders_text(replace(claim, first=busy[0], count=1))}; stop that program or set "
                f"{claim.setting} to a free port (left at its default, shardfuse picks a free one itself)")

    def _ours_hold(self, port: int) -> bool:
        """True if every process listening on ``port`` belongs to this stack (its pid or its process group)."""
        holders = self._holders(port)
        return bool(holders) and all(pid is not None and (pid in self._ours or _group(pid) in self._ours)
                                     for pid in holders)

    def _holders(self, port: int) -> set[int | None]:
        if self._listeners is None:  # one scan of the machine's sockets per `up`
            self._listeners = listening_pids()
        return self._listeners.get(port, set())


def can_bind(host: str, port: int) -> bool:
    """True if a server could listen on ``host:port`` now (SO_REUSEADDR, as Redis and PostgreSQL bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.create_server((host.strip("[]"), port), family=family):
            return True
    except OSError:
        return False


def listening_pids() -> dict[int, set[int | None]]:
    """TCP port -> the processes listening on it (None for one this user may not see)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return {}
    found: dict[int, set[int | None]] = {}
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            found.setdefault(conn.laddr.port, set()).add(conn.pid)
    return found


def _describe(pid: int | None) -> str:
    if pid is None:
        return "a process of another user"
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        command = " ".join(proc.cmdline())[:120] or proc.name()
        return f"pid {pid} ({command})"
    return f"pid {pid}"


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _own_pids(settings: Settings, *, layout: StackLayout, state: StackState | None) -> set[int]:
    """The processes of this data dir's stack: those ``up`` recorded (group leaders: their pools' children are
    in their groups) and the servers its pidfiles name."""
    pids = {comp.pid for comp in state.components.values() if comp.has_processes()} if state else set()
    endpoint = StackAddresses.from_settings(settings).redis
    for found in (redis_server.running_redis(endpoint=endpoint, layout=layout),
                  postgres_server.running_postmaster(layout)):
        if found is not None:
            pids.add(found.pid)
    return pids
