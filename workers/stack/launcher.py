"""``shardfuse up`` / ``shardfuse down``: the embedded single-machine stack as one unit.

Order matters both ways. Up: the servers first (workers and Flower connect to Redis at start), then the
Celery processes. Down: workers first, so that in-flight tasks finish (or are re-queued) while Redis and
PostgreSQL are still there to take their results; the servers last. The object store (SeaweedFS, holding the
CAS) is one of the servers only when ``cas.url`` is ``s3://`` on this machine (:mod:`.cas_server`); with
the default local CAS nothing of it runs.

Workers and Flower run with exactly the settings ``up`` was given: they are written to
``<data_dir>/run/settings.json`` (mode 0600: secrets included) and named in the children's environment
(:mod:`shardfuse.pipeline.config.handoff`), keyword overrides to ``load_settings`` included.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Collection
from dataclasses import dataclass

import psycopg

from shardfuse.pipeline.config.handoff import write_settings_file
from shardfuse.pipeline.config.redaction import redact_dsn, redact_url
from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.names import Queue
from shardfuse.workers.stack import (
    access,
    api_process,
    cas_server,
    celery_processes,
    passwords,
    ports,
    postgres_server,
    processes,
    redis_server,
)
from shardfuse.workers.stack.addresses import StackAddresses
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.launch import Launch, Progress, exclusive, spawn
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.state import StackState, load_state, remove_state, save_state

REDIS = redis_server.NAME
POSTGRES = postgres_server.NAME
OBJECT_STORE = cas_server.NAME
FLOWER = celery_processes.FLOWER
WORKERS: dict[str, Queue] = {celery_processes.worker_component(queue): queue for queue in Queue}
SERVERS = (REDIS, POSTGRES, OBJECT_STORE)
CELERY = (*WORKERS, FLOWER, api_process.NAME)  # the HTTP API too: it runs with the same settings file
# Start order; ``down`` walks it backwards except that the servers stop last.
COMPONENTS: tuple[str, ...] = (*SERVERS, *CELERY)
FLOWER_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class _Plan:
    """What one ``up`` call is to bring up, where, and by when."""

    settings: Settings
    wanted: frozenset[str]
    addresses: StackAddresses
    deadline: float
    object_store: cas_server.ObjectStoreTarget | None  # None: the CAS is not the stack's to serve


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

    Workers and Flower run with ``settings`` exactly, plus the data dir's passwords and S3 keys (:mod:`.passwords`)
    where they name the stack without one, and free ports where its ports are left at defaults (:mod:`.ports`).
    """
    target = cas_server.embedded_target(settings)
    wanted = _select(only) - ({OBJECT_STORE} if target is None else set())
    addresses = StackAddresses.from_settings(settings)
    layout = StackLayout(settings.data_path)
    layout.create()
    access.protect_data_dir(layout, server_user=postgres_server.system_user())
    with exclusive(layout):
        settings, addresses = ports.settle(settings, layout=layout, progress=progress, object_store=target, only=wanted)
        settings = passwords.stack_settings(settings, layout=layout, addresses=addresses, progress=progress,
                                            s3_port=target.port if target else None)  # fmt: skip
        plan = _Plan(settings=settings, wanted=wanted, addresses=addresses, deadline=time.monotonic() + timeout,
                     object_store=target)  # fmt: skip
        launch = Launch(state=_current_state(settings, addresses=addresses, layout=layout), layout=layout,
                        progress=progress)
        with launch.naming_what_runs():
            _start_servers(launch, plan)
            _start_celery(launch, plan)
            _wait_for_celery(launch, plan)
        if not launch.started:
            progress("shardfuse stack: everything was already running; nothing started")
        return launch.state


def _start_servers(launch: Launch, plan: _Plan) -> None:
    """Redis and PostgreSQL (both started before either is waited for: they boot in parallel)."""
    redis_at, postgres_at, layout = plan.addresses.redis, plan.addresses.postgres, launch.layout
    redis_password = redis_server.broker_password(plan.settings.broker.url)
    pg_password = postgres_server.dsn_password(plan.settings.postgres.dsn) or ""  # stack_settings gave one
    if REDIS in plan.wanted:
        launch.ensure(
            REDIS,
            find=lambda: redis_server.running_redis(endpoint=redis_at, layout=layout),
            start=lambda: redis_server.start_redis(endpoint=redis_at, layout=layout, password=redis_password,
                                                   maxmemory_mb=plan.settings.stack.redis_maxmemory_mb),
        )
    if POSTGRES in plan.wanted:
        passwords.announce_postgres_upgrade(layout, launch.progress)
        launch.ensure(
            POSTGRES,
            find=lambda: postgres_server.running_postmaster(layout),
            start=lambda: postgres_server.start_postgres(target=postgres_at, layout=layout),
        )
        passwords.refuse_open_postgres(layout, launch.state.components[POSTGRES].pid)
    # Started while Redis and PostgreSQL boot; it returns once it serves S3.
    _start_object_store(launch, plan)
    if REDIS in plan.wanted:
        launch.wait(REDIS, lambda: redis_server.redis_ready(redis_at, password=redis_password),
                    deadline=plan.deadline)  # fmt: skip
    if POSTGRES in plan.wanted:
        _prepare_database(launch, plan, password=pg_password)
        launch.wait(POSTGRES, lambda: postgres_server.postgres_ready(plan.settings.postgres.dsn),
                    deadline=plan.deadline)  # fmt: skip
    if OBJECT_STORE in plan.wanted:
        launch.wait(OBJECT_STORE, cas_server.bucket_ready(plan.settings, announce=launch.progress),
                    deadline=plan.deadline)  # fmt: skip


def _start_object_store(launch: Launch, plan: _Plan) -> None:
    """SeaweedFS, when the settings' CAS is the stack's own S3 (see :mod:`.cas_server`)."""
    target = plan.object_store
    if target is None or OBJECT_STORE not in plan.wanted:
        return
    cas_server.refuse_moved(launch.state.components.get(OBJECT_STORE), target)
    launch.ensure(OBJECT_STORE, start=lambda: cas_server.start(target, settings=plan.settings, layout=launch.layout,
                                                                deadline=plan.deadline))  # fmt: skip


def _start_celery(launch: Launch, plan: _Plan) -> None:
    """The worker pools and Flower, each given this call's settings through the settings file."""
    if not plan.wanted & set(CELERY):
        return
    layout, settings = launch.layout, plan.settings
    env = celery_processes.child_env(os.environ, write_settings_file(settings, layout.settings_file))
    commands = celery_processes.worker_commands(settings)
    for name, queue in WORKERS.items():
        if name in plan.wanted:
            launch.ensure(name, start=functools.partial(
                spawn, commands[name], log=layout.log_file(name),
                env=celery_processes.worker_env(env, settings, queue),  # + the pool's metrics directory
                marks=celery_processes.worker_marks(queue)))
    if FLOWER in plan.wanted:
        flower_at = plan.addresses.flower
        launch.ensure(FLOWER, start=lambda: spawn(
            celery_processes.flower_command(endpoint=flower_at, db=str(layout.flower_db)),
            log=layout.log_file(FLOWER),
            env=celery_processes.flower_env(settings, env),
            marks=celery_processes.flower_marks(flower_at),
        ))  # fmt: skip
    api_process.ensure(launch, plan.addresses, wanted=plan.wanted, env=env)


def _wait_for_celery(launch: Launch, plan: _Plan) -> None:
    """Block until every wanted pool answers a ping through the broker and Flower serves its pages."""
    nodenames = {name: celery_processes.worker_nodename(queue) for name, queue in WORKERS.items()
                 if name in plan.wanted}
    answered: set[str] = set()

    def worker_answers(node: str) -> bool:
        # One ping to every pool not heard from yet: pinging them one by one would cost each silent
        # pool's full ping timeout in turn.
        if node not in answered:
            pending = [n for n in nodenames.values() if n not in answered]
            answered.update(celery_processes.answering_workers(plan.settings.broker.url, pending))
        return node in answered

    for name, nodename in nodenames.items():
        launch.wait(name, functools.partial(worker_answers, nodename), deadline=plan.deadline)
    if FLOWER in plan.wanted:
        flower = plan.settings.flower
        url, password = plan.addresses.flower_url, flower.password.get_secret_value()
        launch.wait(FLOWER, lambda: celery_processes.flower_ready(url, user=flower.user, password=password),
                    deadline=plan.deadline)  # fmt: skip
    api_process.wait(launch, plan.addresses, wanted=plan.wanted, deadline=plan.deadline)


def down(settings: Settings, *, timeout: float = 30) -> list[str]:
    """Stop what ``up`` recorded: workers (warm shutdown; SIGKILL after ``timeout``), Flower, the servers.

    Returns the names of the components that were running and are now stopped. Safe to call when nothing
    runs. Only recorded processes are touched, and only if they still are the processes ``up`` started.
    """
    layout = StackLayout(settings.data_path)
    if not layout.state_file.exists():
        return []
    with exclusive(layout):
        return _down(layout, timeout=timeout)


def _down(layout: StackLayout, *, timeout: float) -> list[str]:
    state = load_state(layout.state_file)
    if state is None:
        return []
    stopped: list[str] = []
    for names, grace in (
        (list(WORKERS), timeout),
        ([FLOWER, api_process.NAME], min(timeout, FLOWER_STOP_TIMEOUT_S)),
        ([REDIS], timeout),
        ([OBJECT_STORE], min(timeout, cas_server.STOP_GRACE_S)),  # weed lingers long after it has flushed
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
    layout.settings_file.unlink(missing_ok=True)  # no process is left to read its secrets
    return stopped


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
    if recorded.addresses != fresh.addresses and recorded.alive():
        passwords.refuse_running_without_passwords(layout, recorded=recorded.addresses, fresh=fresh.addresses)
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


def _prepare_database(launch: Launch, plan: _Plan, *, password: str) -> None:
    """Create the DSN's role (with its password), database and the vector extension, retrying while the
    server finishes starting."""
    log = launch.state.components[POSTGRES].log
    target = plan.addresses.postgres
    while True:
        try:
            postgres_server.ensure_database(target, socket_dir=launch.layout.postgres_socket_dir, password=password)
            return
        except psycopg.Error as exc:
            if time.monotonic() >= plan.deadline:
                raise StackError(
                    f"postgres: could not create database {target.dbname!r} "
                    f"with the vector extension ({exc}); see its log at {log}"
                ) from exc
            time.sleep(0.25)
