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

Every item received, by either command, passes :func:`shardfuse.workers.broker.envelope.check_envelope` before
kombu sees it; one that fails, or whose delivery kombu or Celery refuse, is set aside in
``shardfuse:unreadable`` with its reason and the consumer goes on to the next (no reconnect, no crash).

Selected by ``broker_transport`` in :mod:`shardfuse.workers.app` for ``redis://``, ``rediss://`` (TLS, verified
by default) and ``sentinel://`` brokers alike.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps

from shardfuse.pipeline.core.errors import UnreadableMessageError
from shardfuse.workers.broker import inbox as broker_inbox
from shardfuse.workers.broker.envelope import QUEUE_TASKS, check_envelope

log = logging.getLogger(__name__)

# How often a receiving consumer refreshes its inbox registration (the reaper's grace is far longer).
REGISTER_EVERY_S = 2.0
# BLMOVE arrived in Redis 6.2.
BLMOVE_SINCE = (6, 2)
# The default of the transport option ``max_message_bytes`` (broker.max_message_bytes).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# kombu is unannotated: its helpers get typed names here, and calls into the classes we extend carry
# `# type: ignore[no-untyped-call]`. What we override is pinned and recorded in
# tests/unit/workers/test_kombu_private_api.py.
_dumps: Callable[[Any], str] = dumps
_bytes_to_str: Callable[[bytes], str] = bytes_to_str


class QoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: str) -> None:
        receiving = self.channel._receiving
        self.channel._recorded = delivery_tag
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
    from_transport_options = (*kombu_redis.Channel.from_transport_options, "max_message_bytes")  # type: ignore[assignment]
    max_message_bytes = MAX_MESSAGE_BYTES
    _short_client: Any = None
    _short_client_lock = threading.Lock()
    _inbox: tuple[str, str] | None = None  # (inbox key, queue) of the pending or last BLMOVE
    _receiving: tuple[str, bytes] | None = None  # (inbox, item) between the move and its record in unacked
    _recorded: str | None = None  # the delivery tag under which the message being delivered went into unacked
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
        # kombu's own, but every item goes through the envelope check (_deliver_item), on both receives.
        inbox, queue = self._inbox if self._inbox is not None else (None, "")
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BRPOP" if inbox is None else "BLMOVE",
                                                   **options)
            except self.connection_errors:
                if inbox is not None:
                    self._inbox_dirty = True
                self.client.connection.disconnect()  # the next receive reconnects
                raise
            if reply is None:  # timed out (an empty item, b"", is an item: it is set aside like any other)
                raise Empty()
            if inbox is None:  # BRPOP: (list, item)
                source, item = reply
                queue = _bytes_to_str(source).rsplit(self.sep, 1)[0]
                self._queue_cycle.rotate(queue)
            else:
                item = reply
            if not self._deliver_item(queue, item, inbox=inbox):
                raise Empty()  # set aside: the consumer goes on to the next item
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()  # type: ignore[no-untyped-call]

    def _deliver_item(self, queue: str, item: bytes, *, inbox: str | None) -> bool:
        """Check ``item`` (received from ``queue``, into ``inbox`` by BLMOVE or by BRPOP) and hand it to kombu.
        An item that is no message a worker can run, or whose delivery kombu or Celery refuse for any reason
        but the broker, is set aside (False): it never reaches a reconnect loop or crashes the worker."""
        try:
            payload = check_envelope(item, max_bytes=self.max_message_bytes, tasks=QUEUE_TASKS.get(queue),
                                     queue=queue)
        except UnreadableMessageError as exc:
            self._set_aside(queue, item, inbox=inbox, tag=None, reason=str(exc))
            return False
        # A fresh tag: the unacked hash is keyed by it, and a tag copied from another message would
        # overwrite that message's record there (and lose it). ack, reject and restore all use this one.
        payload["properties"]["delivery_tag"] = str(uuid.uuid4())
        self._receiving, self._recorded = (None if inbox is None else (inbox, item)), None
        try:
            self.connection._deliver(payload, queue)
        except Exception as exc:
            if self._broker_failure(exc):
                if inbox is not None:
                    self._inbox_dirty = True  # if it never reached unacked, it is still in the inbox
                raise
            log.exception("delivering a message from %s failed; setting it aside", queue)
            self._set_aside(queue, item, inbox=inbox if self._receiving is not None else None,
                            tag=self._recorded, reason=f"refused on delivery: {type(exc).__name__}: {exc}"[:300])
            return False
        finally:
            unrecorded, self._receiving = self._receiving, None
        if unrecorded is not None:  # a no-ack consumer took it: delivered is done
            with self.conn_or_acquire() as client:
                client.lrem(unrecorded[0], 1, item)
        return True

    def _broker_failure(self, exc: Exception) -> bool:
        """Whether ``exc`` is the broker failing (the receive is retried after a reconnect), not the message.
        kombu counts ``KeyError`` as a connection error; raised while delivering, it is the message's."""
        broker = (*self.connection_errors, *self.connection.channel_errors)
        return isinstance(exc, broker) and not isinstance(exc, KeyError)

    def _set_aside(self, queue: str, item: bytes, *, inbox: str | None, tag: str | None, reason: str) -> None:
        try:
            with self.conn_or_acquire() as client:
                broker_inbox.set_aside(client, queue=queue, item=item, reason=reason, inbox=inbox, unacked_tag=tag)
        except self.connection_errors:
            if inbox is not None:
                self._inbox_dirty = True  # still in the inbox: put back, received and refused again
            raise
        if tag is not None:  # recorded before it was refused: forget it here as well
            virtual.QoS.ack(self.qos, tag)  # type: ignore[no-untyped-call]

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


class TlsChannel(Channel):
    """A channel that only ever speaks TLS (``rediss://``). The certificate options come from the URL's
    ``ssl_*`` query parameters (or Celery's ``broker_use_ssl``); a URL without any verifies the server
    against the system's certificate authorities, where kombu's own transport would not verify at all."""

    def _connparams(self, asynchronous: bool = False) -> Any:
        # The kombu Connection this channel serves (Channel._connparams: kept through a reconnect).
        client = self.connection.client or getattr(self, "_client_info", None)
        if client is not None and not client.ssl:
            client.ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        return super()._connparams(asynchronous=asynchronous)


class TlsTransport(Transport):
    Channel = TlsChannel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """Our receive through Redis Sentinel (``sentinel://``): kombu's Sentinel channel finds the master, ours
    receives from it atomically (the inbox and ``unacked`` live on the master like the queues)."""

    from_transport_options = (*kombu_redis.SentinelChannel.from_transport_options,  # type: ignore[assignment]
                              "max_message_bytes")


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


TRANSPORT = f"{__name__}:Transport"
TLS_TRANSPORT = f"{__name__}:TlsTransport"
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"
