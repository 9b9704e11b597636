"""Coalesce each path's burst of events into one look at it, once the path has been quiet for ``settle_s``
(or, for a path that never stops changing, at least every ``max_delay_s``). Pure: time is passed in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardfuse.pipeline.admin.watching.events import Touched


@dataclass(slots=True)
class _Pending:
    first: float  # the first event since the path was last published
    last: float  # the latest event
    is_directory: bool


class Debouncer:
    """Touched paths waiting to settle. ``now`` is any monotonic clock in seconds."""

    def __init__(self, *, settle_s: float, max_delay_s: float) -> None:
        self._settle = settle_s
        self._max_delay = max(max_delay_s, settle_s)
        self._pending: dict[Path, _Pending] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, item: Touched, now: float) -> None:
        """Another event on ``item.path``: its quiet period starts again."""
        held = self._pending.get(item.path)
        if held is None:
            self._pending[item.path] = _Pending(now, now, item.is_directory)
        else:
            held.last = max(held.last, now)
            held.is_directory = held.is_directory or item.is_directory

    def due(self, now: float) -> list[Touched]:
        """The paths settled by ``now`` (taken out), in path order."""
        ready = [path for path, held in self._pending.items() if self._ready(held, now)]
        return self._take(ready)

    def drain(self) -> list[Touched]:
        """Every pending path, settled or not (a last flush before stopping)."""
        return self._take(list(self._pending))

    def put_back(self, items: list[Touched], now: float) -> None:
        """Paths taken but not published (publishing failed): due again at once, merged with any event that
        arrived for them since."""
        for item in items:
            held = self._pending.get(item.path)
            if held is None:
                self._pending[item.path] = _Pending(now - self._max_delay, now - self._settle, item.is_directory)
            else:
                held.first = now - self._max_delay
                held.is_directory = held.is_directory or item.is_directory

    def wake_in(self, now: float) -> float | None:
        """Seconds until the next path is due (0: one is due now); None when nothing is pending."""
        if not self._pending:
            return None
        soonest = min(min(h.last + self._settle, h.first + self._max_delay) for h in self._pending.values())
        return max(0.0, soonest - now)

    def _ready(self, held: _Pending, now: float) -> bool:
        return now - held.last >= self._settle or now - held.first >= self._max_delay

    def _take(self, paths: list[Path]) -> list[Touched]:
        taken = [Touched(path, self._pending.pop(path).is_directory) for path in paths]
        return sorted(taken, key=lambda t: str(t.path))
