"""What ``up`` started, recorded as JSON so that ``down`` (another process, later) stops exactly that."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardfuse.workers.stack import processes
from shardfuse.workers.stack.errors import StackError

STATE_VERSION = 1


@dataclass(frozen=True)
class ComponentState:
    """One running process of the stack.

    ``started_at`` (the process creation time) and ``cmdline_marks`` (substrings its command line must
    contain) tell the recorded process apart from an unrelated one that was later given the same pid.
    """

    pid: int
    log: Path
    started_at: float
    cmdline_marks: tuple[str, ...] = ()

    def is_alive(self) -> bool:
        """True if the recorded process still runs (not a zombie, not a reused pid)."""
        return processes.is_same_process(self.pid, started_at=self.started_at, cmdline_marks=self.cmdline_marks)

    def has_processes(self) -> bool:
        """True if anything of this component is left to stop: the process itself, or (its leader having
        died) members of the process group it led, such as orphaned pool children."""
        if self.is_alive():
            return True
        # A live leader that fails the identity check is a stranger with a reused pid: leave it alone.
        return processes.is_gone(self.pid) and bool(processes.group_members(self.pid))

    @classmethod
    def adopt(cls, pid: int, *, log: Path, cmdline_marks: tuple[str, ...]) -> ComponentState | None:
        """The state of a running process found through a pidfile, if it is the program we expect."""
        if not processes.is_same_process(pid, started_at=None, cmdline_marks=cmdline_marks):
            return None
        return cls(pid=pid, log=log, started_at=processes.process_started_at(pid), cmdline_marks=cmdline_marks)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "log": str(self.log),
            "started_at": self.started_at,
            "cmdline_marks": list(self.cmdline_marks),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ComponentState:
        return cls(
            pid=int(data["pid"]),
            log=Path(data["log"]),
            started_at=float(data["started_at"]),
            cmdline_marks=tuple(str(mark) for mark in data.get("cmdline_marks", ())),
        )


@dataclass(frozen=True)
class StackState:
    """The embedded stack as ``up`` left it: addresses, and per component its pid and log file."""

    data_dir: Path
    broker_url: str
    flower_url: str
    postgres_dsn: str
    components: Mapping[str, ComponentState] = field(default_factory=dict)

    @property
    def addresses(self) -> tuple[str, str, str]:
        """Where the stack is reached: broker, PostgreSQL, Flower (passwords masked, as recorded)."""
        return (self.broker_url, self.postgres_dsn, self.flower_url)

    def alive(self) -> dict[str, int]:
        """Component name -> pid, for the recorded processes that are still running."""
        return {name: comp.pid for name, comp in self.components.items() if comp.is_alive()}

    def dead(self) -> list[str]:
        """Names of recorded components whose process is gone (or whose pid now names another program)."""
        return [name for name, comp in self.components.items() if not comp.is_alive()]

    def with_component(self, name: str, component: ComponentState) -> StackState:
        """A copy with ``name`` recorded as ``component``."""
        return self._with({**self.components, name: component})

    def without(self, name: str) -> StackState:
        """A copy that no longer records ``name``."""
        return self._with({key: comp for key, comp in self.components.items() if key != name})

    def _with(self, components: dict[str, ComponentState]) -> StackState:
        return StackState(
            data_dir=self.data_dir,
            broker_url=self.broker_url,
            flower_url=self.flower_url,
            postgres_dsn=self.postgres_dsn,
            components=components,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "data_dir": str(self.data_dir),
            "broker_url": self.broker_url,
            "flower_url": self.flower_url,
            "postgres_dsn": self.postgres_dsn,
            "components": {name: comp.to_json() for name, comp in self.components.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StackState:
        return cls(
            data_dir=Path(data["data_dir"]),
            broker_url=str(data["broker_url"]),
            flower_url=str(data["flower_url"]),
            postgres_dsn=str(data["postgres_dsn"]),
            components={str(name): ComponentState.from_json(comp) for name, comp in data["components"].items()},
        )


def save_state(path: Path, state: StackState) -> None:
    """Write ``state`` to ``path`` atomically, so a concurrent reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def load_state(path: Path) -> StackState | None:
    """The state recorded at ``path``, or None if there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {STATE_VERSION}")
        return StackState.from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StackError(
            f"stack state file {path} is unreadable ({exc}); stop stray processes by hand and delete it"
        ) from exc


def remove_state(path: Path) -> None:
    """Forget the recorded state (after everything it names has been stopped)."""
    path.unlink(missing_ok=True)
