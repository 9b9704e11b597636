"""What a client application uses: searches through the ``shardfuse.search`` RPC task, and a publisher
connected to the broker and the CAS."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.exceptions import OperationalError

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.workers import replies
from shardfuse.workers.app import create_app
from shardfuse.workers.names import Task
from shardfuse.workers.publishing import CeleryEventSink


class SearchClient:
    """Calls ``shardfuse.search`` on a query worker through the broker, reusing one app and its pools."""

    def __init__(self, settings: Settings) -> None:
        self._app = create_app(settings)
        # No ``task-sent`` event per search: it is one more Redis publish before the query even leaves
        # (0.6-0.9 ms of a ~21 ms RPC, measured). With ``workers.search_events`` on, Flower shows every search
        # from the query worker's own events (received, started, succeeded); only one still queued is unseen.
        self._app.conf.task_send_sent_event = False
        self._broker = settings.broker.display_url
        self._timeout = settings.query.rpc_timeout_s
        self._retry_after_s = settings.query.rpc_retry_after_s
        # The result backend's Redis (its URL, password and TLS settings): where the replies come back.
        self._redis = self._app.backend.client

    def search(self, query: str, zone: str | None = None, **options: Any) -> dict[str, Any]:
        """Search ``zone`` (or several, ``zones=[...]`` instead) for ``query``; ``options`` are any other
        :class:`~shardfuse.query.request.SearchRequest` fields (``k``, ``mode``, ``fusion``, ``filters``,
        ``min_score``, ``keyword_depth``, ``include_text``, ...). What the caller leaves out (or passes as None,
        for ``fusion`` and ``alpha``) the query worker's settings decide. A refused request raises the worker's
        :class:`InvalidQueryError`; a broker out of reach, or no worker answering in time,
        :class:`StoreUnavailableError`.

        The answer comes back on a reply list of its own (workers/replies.py). The search is sent again once
        if it is not answered within ``query.rpc_retry_after_s`` (its worker may have died holding it: the
        broker gives a dead worker's messages back only after ``2 × delivery.dead_after_s``); both copies
        reply onto the same list, so whichever answers first wins."""
        arguments = {"query": query, **({} if zone is None else {"zone": zone}), **options}
        deadline = time.monotonic() + self._timeout
        address = replies.new_address()
        self._send(arguments, address, deadline)
        if 0 < self._retry_after_s < self._timeout:
            answer = replies.wait(self._redis, address, self._retry_after_s)
            if answer is not None:
                return answer
            self._send(arguments, address, deadline)
        answer = replies.wait(self._redis, address, deadline - time.monotonic())
        if answer is None:
            raise StoreUnavailableError(
                f"no query worker answered within {self._timeout:g}s (is the stack up? try `shardfuse status`)")
        return answer

    def _send(self, arguments: dict[str, Any], address: str, deadline: float) -> None:
        # expires: a query nobody waits for any more is dropped instead of answered late. ignore_result: the
        # answer goes to ``address``, not to the result backend.
        try:
            self._app.send_task(Task.SEARCH.value, kwargs=arguments, reply_to=address, ignore_result=True,
                                expires=max(deadline - time.monotonic(), 0.001))
        except OperationalError as exc:  # kombu's, once its own retries are spent
            raise StoreUnavailableError(
                f"cannot send the search to the broker at {self._broker}: {exc} (is the stack up? try "
                "`shardfuse status`)") from exc


def remote_search(settings: Settings, query: str, zone: str | None = None, **options: Any) -> dict[str, Any]:
    """One search through the RPC task (for a single call; reuse a :class:`SearchClient` for many)."""
    return SearchClient(settings).search(query, zone, **options)


@contextmanager
def connect_publisher(settings: Settings) -> Iterator[Publisher]:
    """A :class:`Publisher` writing to the CAS the settings name and publishing on their broker; the events
    it holds are published when the block ends."""
    with CeleryEventSink.connect(settings) as sink:
        yield Publisher(cas=open_content_store(settings), sink=sink)
