"""``shardfuse up`` / ``shardfuse down``: the embedded single-machine stack as one unit.

Order matters both ways. Up: the servers first (workers and Flower connect to Redis at start), then the
Celery processes. Down: workers first, so that in-flight tasks finish (or are re-queued) while Redis and
PostgreSQL are still there to take their results; the servers last.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import psycopg

from shardfuse.pipeline.config.redaction import redact_dsn, redact_url
from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.names import Queue
from shardfuse.workers.stack import celery_processes, postgres_server, processes, redis_server
from shardfuse.workers.stack.addresses import StackAddresses
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.readiness import wait_ready
from shardfuse.workers.stack.state import ComponentState, StackState, load_state, remove_state, save_state

REDIS = redis_server.NAME
POSTGRES = postgres_server.NAME
FLOWER = celery_processes.FLOWER
WORKERS: dict[str, Queue] = {celery_processes.worker_component(queue): queue for queue in Queue}
SERVERS = (REDIS, POSTGRES)
# Start order; ``down`` walks it backwards except that the servers stop last.
COMPONENTS: tuple[str, ...] = (*SERVERS, *WORKERS, FLOWER)
FLOWER_STOP_TIMEOUT_S = 10.0
LEFTOVER_STOP_TIMEOUT_S = 5.0

Progress = Callable[[str], None]


def read_state(settings: Settings) -> StackState | None:
    """What the last ``up`` recorded for this data dir, or None if nothing was started (or all stopped)."""
    return load_state(StackLayout(settings.data_path).state_file)


def up(
    settings: Settings,
    *,
    progress: Progress = print,
    timeout: float = 120,
    only: Collection[str] | None = None,
) -> StackState:
    """Start every component that is not already running, and return once all of them answer.

    Safe to call again: running components are left alone, dead ones (or ones whose pid now belongs to
    another program) are restarted. ``only`` restricts the call to some components (``{"redis",
    "postgres"}`` for the servers alone). Raises StackError naming the component and its log file if one
    is not ready within ``timeout`` seconds, ConfigurationError if an address is not loopback.

    Workers and Flower inherit ``os.environ``: settings that the caller built from anything else (keyword
    overrides to ``load_settings``) must also be exported as ``SHARDFUSE_*`` variables to reach them.
    """
    wanted = _select(only)
    addresses = StackAddresses.from_settings(settings)
    layout = StackLayout(settings.data_path)
    layout.create()
    with _exclusive(layout):
        return _up(settings, wanted=wanted, addresses=addresses, layout=layout, progress=progress,
                   timeout=timeout)  # fmt: skip


def _up(
    settings: Settings,
    *,
    wanted: frozenset[str],
    addresses: StackAddresses,
    layout: StackLayout,
    progress: Progress,
    timeout: float,
) -> StackState:
    deadline = time.monotonic() + timeout
    state = _current_state(settings, addresses=addresses, layout=layout)
    redis_password = redis_server.broker_password(settings.broker.url)
    pg_password = postgres_server.dsn_password(settings.postgres.dsn)
    launch = _Launch(state=state, layout=layout, progress=progress)

    if REDIS in wanted:
        launch.ensure(
            REDIS,
            find=lambda: redis_server.running_redis(endpoint=addresses.redis, layout=layout),
            start=lambda: redis_server.start_redis(endpoint=addresses.redis, layout=layout, password=redis_password),
        )
    if POSTGRES in wanted:
        launch.ensure(
            POSTGRES,
            find=lambda: postgres_server.running_postmaster(layout),
            start=lambda: postgres_server.start_postgres(target=addresses.postgres, layout=layout,
                                                         password=pg_password),
        )
    if REDIS in wanted:
        launch.wait(REDIS, lambda: redis_server.redis_ready(addresses.redis, password=redis_password),
                    deadline=deadline)  # fmt: skip
    if POSTGRES in wanted:
        _prepare_database(launch, addresses=addresses, deadline=deadline, password=pg_password)
        launch.wait(POSTGRES, lambda: postgres_server.postgres_ready(settings.postgres.dsn), deadline=deadline)

    env = celery_processes.celery_env(os.environ)
    commands = celery_processes.worker_commands(settings)
    for name, queue in WORKERS.items():
        if name in wanted:
            launch.ensure(
                name,
                start=functools.partial(
                    _spawn, commands[name], log=layout.log_file(name), env=env,
                    marks=celery_processes.worker_marks(queue),
                ),
            )  # fmt: skip
    if FLOWER in wanted:
        launch.ensure(
            FLOWER,
            start=lambda: _spawn(
                celery_processes.flower_command(endpoint=addresses.flower, db=str(layout.flower_db)),
                log=layout.log_file(FLOWER),
                env=celery_processes.flower_env(settings, env),
                marks=celery_processes.flower_marks(addresses.flower),
            ),
        )
    nodenames = {name: celery_processes.worker_nodename(queue) for name, queue in WORKERS.items()}
    answered: set[str] = set()

    def worker_answers(node: str) -> bool:
        # One ping to every pool not heard from yet: pinging them one by one would cost each silent
        # pool's full ping timeout in turn.
        if node not in answered:
            pending = [n for name, n in nodenames.items() if name in wanted and n not in answered]
            answered.update(celery_processes.answering_workers(settings.broker.url, pending))
        return node in answered

    for name, nodename in nodenames.items():
        if name in wanted:
            launch.wait(name, functools.partial(worker_answers, nodename), deadline=deadline)
    if FLOWER in wanted:
        password = settings.flower.password.get_secret_value()
        launch.wait(
            FLOWER,
            lambda: celery_processes.flower_ready(addresses.flower_url, user=settings.flower.user,
                                                  password=password),
            deadline=deadline,
        )  # fmt: skip
    if not launch.started:
        progress("shardfuse stack: everything was already running; nothing started")
    return launch.state


def down(settings: Settings, *, timeout: float = 30) -> list[str]:
    """Stop what ``up`` recorded: workers (warm shutdown; SIGKILL after ``timeout``), Flower, the servers.

    Returns the names of the components that were running and are now stopped. Safe to call when nothing
    runs. Only recorded processes are touched, and only if they still are the processes ``up`` started.
    """
    layout = StackLayout(settings.data_path)
    if not layout.state_file.exists():
        return []
    with _exclusive(layout):
        return _down(layout, timeout=timeout)


def _down(layout: StackLayout, *, timeout: float) -> list[str]:
    state = load_state(layout.state_file)
    if state is None:
        return []
    stopped: list[str] = []
    for names, grace in (
        (list(WORKERS), timeout),
        ([FLOWER], min(timeout, FLOWER_STOP_TIMEOUT_S)),
        ([REDIS], timeout),
    ):
        running = [name for name in names if name in state.components and state.components[name].has_processes()]
        # SIGTERM to every group at once, so the pools shut down in parallel rather than one after another.
        processes.stop_process_groups([state.components[name].pid for name in running], timeout=grace)
        stopped.extend(running)
        for name in names:
            state = state.without(name)
        save_state(layout.state_file, state)
    postgres = state.components.get(POSTGRES)
    if postgres is not None and postgres.has_processes():
        postgres_server.stop_postgres(layout, pid=postgres.pid, timeout=timeout)
        stopped.append(POSTGRES)
    remove_state(layout.state_file)
    return stopped


class _Launch:
    """The state being built by one ``up`` call, saved after every change so that a failed ``up`` can
    still be undone by ``down``."""

    def __init__(self, *, state: StackState, layout: StackLayout, progress: Progress) -> None:
        self.state = state
        self.layout = layout
        self.progress = progress
        self.started: list[str] = []

    def ensure(
        self,
        name: str,
        *,
        start: Callable[[], ComponentState],
        find: Callable[[], ComponentState | None] | None = None,
    ) -> None:
        """Leave ``name`` alone if its recorded process runs, adopt it if ``find`` finds it, else start it."""
        recorded = self.state.components.get(name)
        if recorded is not None and recorded.is_alive():
            self.progress(f"{name}: already running (pid {recorded.pid})")
            return
        found = find() if find is not None else None
        if found is not None:
            self.progress(f"{name}: found running (pid {found.pid}); adopting it")
            self._record(name, found)
            return
        if recorded is not None:
            self.progress(f"{name}: recorded pid {recorded.pid} is gone (or reused); restarting")
            if recorded.has_processes():
                # The leader died but left members (pool children) that would still consume tasks.
                processes.stop_process_groups([recorded.pid], timeout=LEFTOVER_STOP_TIMEOUT_S)
        self.progress(f"{name}: starting (log: {self.layout.log_file(name)})")
        component = start()
        self.started.append(name)
        self._record(name, component)

    def wait(self, name: str, ready: Callable[[], bool], *, deadline: float) -> None:
        """Block until ``name`` answers; StackError naming its log file if it does not by ``deadline``."""
        component = self.state.components[name]
        wait_ready(name, ready, deadline=deadline, log=component.log, alive=component.is_alive)
        self.progress(f"{name}: ready")

    def _record(self, name: str, component: ComponentState) -> None:
        self.state = self.state.with_component(name, component)
        save_state(self.layout.state_file, self.state)


@contextlib.contextmanager
def _exclusive(layout: StackLayout) -> Iterator[None]:
    """Hold the data dir's lock: two ``up``s racing would both start a Redis on the same port."""
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    with open(layout.run_dir / "stack.lock", "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StackError(
                f"another `shardfuse up`/`down` is working on {layout.data_dir}; wait for it to finish"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _select(only: Collection[str] | None) -> frozenset[str]:
    if only is None:
        return frozenset(COMPONENTS)
    unknown = set(only) - set(COMPONENTS)
    if unknown:
        raise StackError(f"unknown stack components {sorted(unknown)}; choose from {list(COMPONENTS)}")
    return frozenset(only)


def _current_state(settings: Settings, *, addresses: StackAddresses, layout: StackLayout) -> StackState:
    """The recorded state, checked against the settings; an empty one if nothing was recorded."""
    # Recorded (and printed) with their passwords masked: the state file is no place for secrets.
    fresh = StackState(
        data_dir=layout.data_dir,
        broker_url=redact_url(settings.broker.url),
        flower_url=addresses.flower_url,
        postgres_dsn=redact_dsn(settings.postgres.dsn),
    )
    recorded = load_state(layout.state_file)
    if recorded is None:
        return fresh
    changed = (recorded.broker_url, recorded.postgres_dsn, recorded.flower_url) != (
        fresh.broker_url, fresh.postgres_dsn, fresh.flower_url,
    )  # fmt: skip
    if changed and recorded.alive():
        raise StackError(
            f"the stack in {layout.data_dir} is running with other addresses (broker {recorded.broker_url}, "
            f"flower {recorded.flower_url}); run `shardfuse down` first"
        )
    return StackState(
        data_dir=fresh.data_dir,
        broker_url=fresh.broker_url,
        flower_url=fresh.flower_url,
        postgres_dsn=fresh.postgres_dsn,
        components=recorded.components,
    )


def _prepare_database(launch: _Launch, *, addresses: StackAddresses, deadline: float, password: str | None) -> None:
    """Create the DSN's role (with its password), database and the vector extension, retrying while the
    server finishes starting."""
    log = launch.state.components[POSTGRES].log
    while True:
        try:
            postgres_server.ensure_database(addresses.postgres, socket_dir=launch.layout.postgres_socket_dir,
                                            password=password)
            return
        except psycopg.Error as exc:
            if time.monotonic() >= deadline:
                raise StackError(
                    f"postgres: could not create database {addresses.postgres.dbname!r} "
                    f"with the vector extension ({exc}); see its log at {log}"
                ) from exc
            time.sleep(0.25)


def _spawn(argv: list[str], *, log: Path, env: dict[str, str], marks: tuple[str, ...]) -> ComponentState:
    pid = processes.spawn_detached(argv, log=log, env=env)
    return ComponentState(pid=pid, log=log, started_at=processes.process_started_at(pid), cmdline_marks=marks)
