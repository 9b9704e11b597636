"""Start, recognise and stop the stack's long-running processes (psutil and signals; no stack knowledge)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from shardfuse.workers.stack.errors import StackError

# psutil reports create_time rounded to the clock tick; allow for that when comparing.
CREATE_TIME_TOLERANCE_S = 0.05
POLL_INTERVAL_S = 0.05
KILL_WAIT_S = 5.0


def process_started_at(pid: int) -> float:
    """The creation time of ``pid`` (seconds since the epoch), recorded to detect pid reuse later."""
    return float(psutil.Process(pid).create_time())


def is_same_process(pid: int, *, started_at: float | None, cmdline_marks: Sequence[str]) -> bool:
    """True if ``pid`` runs, is not a zombie, and is still the process we recorded.

    A pid is only a number: after a crash and a reboot (or enough churn) it may belong to an unrelated
    program, and signalling that program would be a bug. The creation time and the command line both
    have to match.
    """
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap(pid)
            return False
        if started_at is not None and abs(proc.create_time() - started_at) > CREATE_TIME_TOLERANCE_S:
            return False
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return all(mark in cmdline for mark in cmdline_marks)


def is_gone(pid: int) -> bool:
    """True if no process ``pid`` exists any more (a zombie whose threads have all exited counts as gone)."""
    try:
        return _is_dead_zombie(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


def spawn_detached(
    argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> int:
    """Start ``argv`` in its own session with stdout/stderr appended to ``log``; return its pid.

    Its own session means its own process group, so the group can be signalled as one (prefork children
    included) and a terminal hang-up in the launching shell does not reach it.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    return proc.pid


def stop_process_groups(pgids: Sequence[int], *, timeout: float, sig: signal.Signals = signal.SIGTERM) -> None:
    """Send ``sig`` to every process of the groups ``pgids``, wait up to ``timeout``, then SIGKILL the rest.

    Returns once no member of the groups is alive. Signalling whole groups is what reaches a prefork
    pool's children, even ones orphaned by a crashed parent.
    """
    procs = [proc for pgid in pgids for proc in group_members(pgid)]
    if not procs:
        return
    _signal(pgids, procs, sig)
    alive = _wait_all_gone(procs, timeout=timeout)
    if alive:
        _signal(pgids, alive, signal.SIGKILL)
        alive = _wait_all_gone(alive, timeout=KILL_WAIT_S)
    if alive:
        # Unkillable processes (stuck in the kernel) are beyond what a launcher can fix; say which.
        raise StackError(f"processes {[p.pid for p in alive]} survived SIGKILL")


def group_members(pgid: int) -> list[psutil.Process]:
    """Every live process whose process group is ``pgid`` (the leader and, e.g., its pool children).

    Linux never hands out a pid that is still some group's id, so while any member is left the group is
    still the one we started.
    """
    members: list[psutil.Process] = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and not _is_dead_zombie(proc):
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return members


def wait_gone(pid: int, *, timeout: float) -> bool:
    """Wait until ``pid`` has exited (reaping it if it is our child); True if it did within ``timeout``."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    return not _wait_all_gone([proc], timeout=timeout)


def port_in_use(host: str, port: int) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _signal(pgids: Sequence[int], procs: Sequence[psutil.Process], sig: signal.Signals) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    # A member that moved to a group of its own since we listed it is signalled by pid (once: a second
    # SIGTERM is harmless, but a second SIGINT makes a Celery worker drop its running tasks).
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if os.getpgid(proc.pid) not in pgids:
                proc.send_signal(sig)


def _wait_all_gone(procs: Sequence[psutil.Process], *, timeout: float) -> list[psutil.Process]:
    """Poll until every process in ``procs`` has exited; return those still alive at ``timeout``.

    Polled by hand: psutil.wait_procs takes seconds to notice the exit of a process that is not our child.
    """
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while True:
        alive = [proc for proc in alive if not _has_exited(proc)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_INTERVAL_S)


def _has_exited(proc: psutil.Process) -> bool:
    _reap(proc.pid)
    try:
        # is_running() also compares the creation time, so a reused pid counts as exited.
        return not proc.is_running() or _is_dead_zombie(proc)
    except psutil.NoSuchProcess:
        return True


def _is_dead_zombie(proc: psutil.Process) -> bool:
    """True if ``proc`` is a zombie and none of its threads is left.

    A multi-threaded process (redis-server) killed by a signal shows as a zombie as soon as its main
    thread has exited, while its other threads may still be on their way out; until the last one is, the
    process keeps its files open, a listening socket included. Counting it as gone that early lets a
    replacement find the port still taken.
    """
    return bool(proc.status() == psutil.STATUS_ZOMBIE and proc.num_threads() <= 1)


def _reap(pid: int) -> None:
    """Collect the exit status of a dead child of ours so it stops showing up as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
