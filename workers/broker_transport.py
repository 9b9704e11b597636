"""kombu's Redis transport, with one reusable client per channel for its short commands.

kombu builds a new ``redis.Redis`` object for every command it sends outside the consuming connection:
each acknowledgement, each unacked-message bookkeeping step, each task-event publish. With redis-py 8 the
constructor builds response-callback tables and driver info every time: a thread-pool embed worker of
ours spent 44 of its 319 GIL samples (py-spy) in it. A ``redis.Redis`` object holds no
connection of its own: it checks one out of its pool per command, so one object serves every thread of
the channel. The consuming side (BRPOP on the asynchronous pool) is untouched. It also keeps the
connection parameters through a broker restart (``_connparams``, below).

Selected by ``broker_transport`` in :mod:`workers.app_factory` for ``redis://`` brokers (``rediss://`` and
``sentinel://`` keep kombu's own transport).
"""

from __future__ import annotations

import threading
from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _short_client: Any = None
    _short_client_lock = threading.Lock()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client_info = self.connection.client

    def _connparams(self, asynchronous: bool = False) -> Any:
        # After the broker goes away, Celery's reconnect path calls Connection.collect(), which detaches the
        # transport from its connection (client = None); closing the old channel then restores its unacked
        # messages, which needs the connection parameters: the worker died with "'NoneType' object has no
        # attribute 'hostname'" instead of reconnecting (kombu 5.7, any Redis restart while a message is held).
        transport = self.connection
        if transport is not None and transport.client is None:
            transport.client = self._client_info
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        pool = self.pool  # replaced after a fork or a disconnect: a client of the old one is not reused
        client = self._short_client
        if client is None or client.connection_pool is not pool:
            with self._short_client_lock:
                client = self._short_client
                if client is None or client.connection_pool is not pool:
                    client = self._short_client = super()._create_client(asynchronous=False)  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
