"""The bookkeeping of one ``shardfuse up``: the data dir's lock, and the state being built as components
are found, adopted or started (saved after every change, so that a failed ``up`` can still be undone by
``down``)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path

from shardfuse.workers.stack import processes
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.readiness import wait_ready
from shardfuse.workers.stack.state import ComponentState, StackState, save_state

LEFTOVER_STOP_TIMEOUT_S = 5.0

Progress = Callable[[str], None]


class Launch:
    """The state being built by one ``up`` call."""

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

    @contextlib.contextmanager
    def naming_what_runs(self) -> Iterator[None]:
        """A start that fails says which components are running all the same (kept, and recorded, so
        that ``up`` again resumes from them once the cause is fixed) and how to stop them."""
        try:
            yield
        except StackError as exc:
            running = sorted(self.state.alive())
            if not running:
                raise
            raise StackError(f"{exc}\nstill running: {', '.join(running)} (`shardfuse up` again, once that is "
                             "fixed, starts the rest; `shardfuse down` stops them)") from exc

    def _record(self, name: str, component: ComponentState) -> None:
        self.state = self.state.with_component(name, component)
        save_state(self.layout.state_file, self.state)


@contextlib.contextmanager
def exclusive(layout: StackLayout) -> Iterator[None]:
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


def spawn(argv: list[str], *, log: Path, env: dict[str, str], marks: tuple[str, ...]) -> ComponentState:
    """Start ``argv`` detached (its own process group, output appended to ``log``) and describe it."""
    pid = processes.spawn_detached(argv, log=log, env=env)
    return ComponentState(pid=pid, log=log, started_at=processes.process_started_at(pid), cmdline_marks=marks)
