"""What a client application uses: searches through the ``shardfuse.search`` RPC task, and a publisher
connected to the broker and the CAS."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.workers.app import create_app
from shardfuse.workers.names import Task
from shardfuse.workers.publishing import CeleryEventSink

# While a search sent again waits for its answer, how often the first copy is looked at too.
RETRY_POLL_S = 0.2


class SearchClient:
    """Calls ``shardfuse.search`` on a query worker through the broker, reusing one app and its pools."""

    def __init__(self, settings: Settings) -> None:
        self._app = create_app(settings)
        # No ``task-sent`` event per search: it is one more Redis publish before the query even leaves
        # (0.6-0.9 ms of a ~21 ms RPC, measured). With ``workers.search_events`` on, Flower shows every search
        # from the query worker's own events (received, started, succeeded); only one still queued is unseen.
        self._app.conf.task_send_sent_event = False
        self._timeout = settings.query.rpc_timeout_s
        self._retry_after_s = settings.query.rpc_retry_after_s

    def search(self, query: str, zone: str | None = None, **options: Any) -> dict[str, Any]:
        """Search ``zone`` (or several, ``zones=[...]`` instead) for ``query``; ``options`` are any other
        :class:`~shardfuse.query.request.SearchRequest` fields (``k``, ``mode``, ``fusion``, ``filters``,
        ``min_score``, ``keyword_depth``, ``include_text``, ...). What the caller leaves out (or passes as None,
        for ``fusion`` and ``alpha``) the query worker's settings decide. A refused request raises the worker's
        :class:`InvalidQueryError`."""
        arguments = {"query": query, **({} if zone is None else {"zone": zone}), **options}
        deadline = time.monotonic() + self._timeout
        sent: list[AsyncResult] = []
        try:
            return self._first_answer(arguments, sent, deadline)
        except CeleryTimeout as exc:
            raise StoreUnavailableError(
                f"no query worker answered within {self._timeout:g}s (is the stack up? try `shardfuse status`)"
            ) from exc
        finally:
            for result in sent:
                result.forget()

    def _send(self, arguments: dict[str, Any], sent: list[AsyncResult], deadline: float) -> AsyncResult:
        # expires: a query nobody waits for any more is dropped instead of answered late.
        result = self._app.send_task(Task.SEARCH.value, kwargs=arguments,
                                     expires=max(deadline - time.monotonic(), 0.001))
        sent.append(result)
        return result

    def _first_answer(self, arguments: dict[str, Any], sent: list[AsyncResult], deadline: float) -> dict[str, Any]:
        """The answer of the search, sent again once if the first copy is not answered within
        ``query.rpc_retry_after_s`` (its worker may have died holding it: the broker gives a dead worker's
        messages back only after ``2 × delivery.dead_after_s``); whichever copy is answered first wins."""
        first = self._send(arguments, sent, deadline)
        if not 0 < self._retry_after_s < self._timeout:
            answer: dict[str, Any] = first.get(timeout=self._timeout)
            return answer
        try:
            answer = first.get(timeout=self._retry_after_s)
            return answer
        except CeleryTimeout:
            pass
        again = self._send(arguments, sent, deadline)
        while True:
            # Wait on the new copy (the backend wakes us when it is answered); look at the first in between.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CeleryTimeout("the search was not answered in time")
            try:
                answer = again.get(timeout=min(remaining, RETRY_POLL_S))
                return answer
            except CeleryTimeout:
                if first.ready():
                    answer = first.get(timeout=remaining)
                    return answer


def remote_search(settings: Settings, query: str, zone: str | None = None, **options: Any) -> dict[str, Any]:
    """One search through the RPC task (for a single call; reuse a :class:`SearchClient` for many)."""
    return SearchClient(settings).search(query, zone, **options)


@contextmanager
def connect_publisher(settings: Settings) -> Iterator[Publisher]:
    """A :class:`Publisher` writing to the CAS the settings name and publishing on their broker; the events
    it holds are published when the block ends."""
    with CeleryEventSink.connect(settings) as sink:
        yield Publisher(cas=open_content_store(settings), sink=sink)
