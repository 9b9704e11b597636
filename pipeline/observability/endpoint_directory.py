"""Where the pools' ``/metrics`` endpoints are: each pool announces its URL in the broker's Redis, again every
few seconds while it runs, so that ``shardfuse status`` finds every pool of a deployment and adds their
counts up (Prometheus finds them its own way: scrape configs, Kubernetes annotations).

Only addresses go through Redis, never a count. An announcement is a member of one sorted set scored by the
Redis server's clock (one clock for every host); a pool silent for ``stale_after_s`` (stopped, killed, cut
off) is dropped by the next reader. A pool that stops cleanly withdraws at once.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import redis

from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.core.loopback_http import open_url

log = logging.getLogger(__name__)

ENDPOINTS_KEY = "shardfuse:metrics:endpoints"
SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class PoolEndpoint:
    """The ``/metrics`` URL of one worker pool (``node``: its Celery node name, ``ingest@host``)."""

    node: str
    url: str

    def member(self) -> str:
        return json.dumps({"node": self.node, "url": self.url}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_member(cls, raw: bytes | str) -> PoolEndpoint:
        fields = json.loads(raw)
        return cls(node=str(fields["node"]), url=str(fields["url"]))


class EndpointDirectory:
    """The announced endpoints, in Redis. ``redis.RedisError`` when Redis cannot be reached."""

    def __init__(self, client: redis.Redis, *, stale_after_s: float) -> None:
        self._client = client
        self._stale_after_s = stale_after_s

    def _now_s(self) -> float:
        seconds, micros = self._client.time()
        return float(seconds) + micros / 1e6

    def announce(self, endpoint: PoolEndpoint) -> None:
        self._client.zadd(ENDPOINTS_KEY, {endpoint.member(): self._now_s()})

    def withdraw(self, endpoint: PoolEndpoint) -> None:
        self._client.zrem(ENDPOINTS_KEY, endpoint.member())

    def endpoints(self) -> list[PoolEndpoint]:
        """The endpoints announced within ``stale_after_s``, by node name (older ones are removed)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.zremrangebyscore(ENDPOINTS_KEY, "-inf", f"({self._now_s() - self._stale_after_s}")
        pipe.zrange(ENDPOINTS_KEY, 0, -1)
        _, members = pipe.execute()
        return sorted((PoolEndpoint.from_member(m) for m in members), key=lambda e: (e.node, e.url))


class Announcer:
    """Announces ``endpoint`` now and every ``interval_s`` on a daemon thread; :meth:`stop` withdraws it.
    A failed announcement (Redis restarting) is logged once and tried again at the next interval."""

    def __init__(self, directory: EndpointDirectory, endpoint: PoolEndpoint, *, interval_s: float) -> None:
        self._directory = directory
        self.endpoint = endpoint
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="shardfuse-metrics-announce", daemon=True)

    def start(self) -> Announcer:
        self._announce()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._announce()

    def _announce(self) -> None:
        try:
            self._directory.announce(self.endpoint)
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("cannot announce the metrics endpoint %s in Redis (will retry): %s", self.endpoint.url, exc)
            self._failing = True
            return
        self._failing = False

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._interval_s + 1)
        try:
            self._directory.withdraw(self.endpoint)
        except redis.RedisError as exc:  # it goes stale on its own
            log.info("cannot withdraw the metrics endpoint %s: %s", self.endpoint.url, exc)


def scrape(url: str, *, timeout_s: float = SCRAPE_TIMEOUT_S) -> str:
    """The text a ``/metrics`` endpoint serves; :class:`StoreUnavailableError` if it cannot be read."""
    try:
        response: Any
        with open_url(url, timeout=timeout_s) as response:
            return str(response.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, UnicodeDecodeError) as exc:
        raise StoreUnavailableError(f"cannot read the metrics at {url}: {exc}") from exc
