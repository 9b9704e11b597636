"""kombu's Redis transport, receiving atomically, with one reusable client per channel for its short commands.

A consumer of one queue receives with BLMOVE into its inbox instead of BRPOP, and records the message in
``unacked`` and takes it out of the inbox in one MULTI: no instant in which a killed worker holds a message
that is in no list (:mod:`shardfuse.workers.broker.inbox`). A consumer of several queues, or one configured with
priority steps or a global key prefix, keeps kombu's BRPOP.

kombu builds a new ``redis.Redis`` object for every command it sends outside the consuming connection:
each acknowledgement, each unacked-message bookkeeping step, each task-event publish. With redis-py 8 the
constructor builds response-callback tables and driver info every time: a thread-pool embed worker of
ours spent 44 of its 319 GIL samples (py-spy) in it. A ``redis.Redis`` object holds no
connection of its own: it checks one out of its pool per command, so one object serves every thread of
the channel. The consuming side (BRPOP on the asynchronous pool) is untouched. It also keeps the
connection parameters through a broker restart (``_connparams``, below).

Selected by ``broker_transport`` in :mod:`shardfuse.workers.app` for ``redis://`` brokers (``rediss://`` and
``sentinel://`` keep kombu's own transport).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

from shardfuse.workers.broker import inbox as broker_inbox

log = logging.getLogger(__name__)

# How often a receiving consumer refreshes its inbox registration (the reaper's grace is far longer).
REGISTER_EVERY_S = 2.0
# BLMOVE arrived in Redis 6.2.
BLMOVE_SINCE = (6, 2)

# kombu is unannotated: its helpers get typed names here, and calls into the classes we extend carry
# `# type: ignore[no-untyped-call]`. What we override is pinned and recorded in
# tests/unit/workers/test_kombu_private_api.py.
_dumps: Callable[[Any], str] = dumps
_loads: Callable[[str], Any] = loads
_bytes_to_str: Callable[[bytes], str] = bytes_to_str


class QoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: str) -> None:
        receiving = self.channel._receiving
        if receiving is None:  # received by BRPOP (or basic_get): kombu's own bookkeeping
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        inbox, item = receiving
        delivery = message.delivery_info
        with self.pipe_or_acquire() as pipe:  # one MULTI: from the inbox into unacked
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}) \
                .hset(self.unacked_key, delivery_tag,
                      _dumps([message._raw, delivery["exchange"], delivery["routing_key"]])) \
                .lrem(inbox, 1, item) \
                .execute()
        self.channel._receiving = None
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    QoS = QoS
    _short_client: Any = None
    _short_client_lock = threading.Lock()
    _inbox: tuple[str, str] | None = None  # (inbox key, queue) of the pending or last BLMOVE
    _receiving: tuple[str, bytes] | None = None  # (inbox, item) between the move and its record in unacked
    _inbox_dirty = False  # a BLMOVE reply may have been lost: put the inbox back before receiving again
    _registered_at = 0.0
    _blmove: bool | None = None  # whether the server has BLMOVE (asked once)
    # kombu declares these as False and None; they hold the connection a receive is pending on and its send time.
    _in_poll: Any
    _brpop_sent_at: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
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

    def _atomic_queue(self) -> str | None:
        """The one queue this channel consumes, if it can receive it with BLMOVE."""
        queues = self.active_queues
        if len(queues) != 1 or self.global_keyprefix or list(self.priority_steps) != [0]:
            return None
        if self._blmove is None:
            with self.conn_or_acquire() as client:
                version = str(client.info("server").get("redis_version", "0"))
            self._blmove = tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) >= BLMOVE_SINCE
            if not self._blmove:
                log.warning("Redis %s has no BLMOVE: receiving with BRPOP, so a worker killed while it "
                            "receives a message can lose it (upgrade to Redis 6.2 or later)", version)
        return next(iter(queues)) if self._blmove else None

    def _brpop_start(self, timeout: Any = None) -> None:
        queue = self._atomic_queue()
        if queue is None:
            self._inbox = None
            super()._brpop_start(timeout)  # type: ignore[no-untyped-call]
            return
        holder = broker_inbox.consumer_holder()
        inbox = broker_inbox.inbox_key(holder, queue)
        if self._inbox != (inbox, queue):
            self._inbox, self._inbox_dirty, self._registered_at = (inbox, queue), True, 0.0
        now = time.monotonic()
        if self._inbox_dirty or now - self._registered_at >= REGISTER_EVERY_S:
            with self.conn_or_acquire() as client:
                if self._inbox_dirty:
                    moved = broker_inbox.put_back(client, inbox=inbox, queue=queue)
                    if moved:
                        log.warning("put %d message(s) whose delivery was cut off back on %s", moved, queue)
                    self._inbox_dirty = False
                broker_inbox.register(client, inbox=inbox, holder=holder, queue=queue)
            self._registered_at = now
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        self.client.connection.send_command("BLMOVE", queue, inbox, "RIGHT", "LEFT",
                                            self.brpop_timeout if timeout is None else timeout)

    def _brpop_read(self, **options: Any) -> bool:
        if self._inbox is None:
            return bool(super()._brpop_read(**options))  # type: ignore[no-untyped-call]
        inbox, queue = self._inbox
        try:
            try:
                item = self.client.parse_response(self.client.connection, "BLMOVE", **options)
            except self.connection_errors:
                self._inbox_dirty = True
                self.client.connection.disconnect()  # the next receive reconnects
                raise
            if not item:
                raise Empty()
            self._deliver_moved(inbox, queue, item)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()  # type: ignore[no-untyped-call]

    def _deliver_moved(self, inbox: str, queue: str, item: bytes) -> None:
        try:
            payload = _loads(_bytes_to_str(item))
            if not isinstance(payload, dict):
                raise TypeError(f"a JSON {type(payload).__name__}, not an object")
        except (ValueError, TypeError) as exc:
            with self.conn_or_acquire() as client:
                broker_inbox.quarantine(client, inbox=inbox, item=item, reason=f"not a kombu message: {exc}")
            return
        self._receiving = (inbox, item)
        try:
            self.connection._deliver(payload, queue)
        except self.connection_errors:
            self._inbox_dirty = True  # if it never reached unacked, it is still in the inbox: put back
            raise
        except Exception as exc:
            if self._receiving is not None:  # refused before it was recorded (a malformed envelope)
                with self.conn_or_acquire() as client:
                    broker_inbox.quarantine(client, inbox=inbox, item=item, reason=repr(exc))
            raise
        finally:
            unrecorded, self._receiving = self._receiving, None
        if unrecorded is not None:  # a no-ack consumer took it: delivered is done
            with self.conn_or_acquire() as client:
                client.lrem(inbox, 1, item)

    def _on_connection_disconnect(self, connection: Any) -> None:
        if self._inbox is not None and self._in_poll is connection:
            self._inbox_dirty = True  # a BLMOVE was pending: it may have moved a message we will never read
        super()._on_connection_disconnect(connection)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self._inbox is not None and not self.closed:
            self._closing = True
            inbox, queue = self._inbox
            try:
                if self._in_poll:
                    with contextlib.suppress(Empty):
                        self._brpop_read()  # delivered now, then handed back with the rest of unacked
                with self.conn_or_acquire() as client:
                    broker_inbox.put_back(client, inbox=inbox, queue=queue, forget=True)
            except self.connection_errors:
                # The broker is away. This process puts the inbox back when it next receives from the queue
                # (the key names the process and the queue); if it never does, the delivery reaper will.
                log.warning("could not empty inbox %s on close (broker unreachable)", inbox)
        super().close()  # type: ignore[no-untyped-call]

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
