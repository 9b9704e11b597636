"""HTTP GETs to our own processes: a request to a loopback host never goes through a proxy.

urllib follows ``http_proxy`` / ``HTTPS_PROXY`` for every host not named in ``no_proxy``, loopback included, so
on a machine with a proxy configured (common behind a corporate proxy) the embedded stack's readiness probes and
``shardfuse status``'s reads of the pools' ``/metrics`` would ask the proxy for ``127.0.0.1`` and never get an
answer. Other hosts keep urllib's usual proxy handling.
"""

from __future__ import annotations

import urllib.request
from http.client import HTTPResponse
from urllib.parse import urlsplit

from shardfuse.pipeline.config.stack_secrets import is_loopback

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def open_url(request: str | urllib.request.Request, *, timeout: float) -> HTTPResponse:
    """``urllib.request.urlopen(request)``, without any proxy when the host is loopback (same errors)."""
    url = request.full_url if isinstance(request, urllib.request.Request) else request
    host = urlsplit(url).hostname or ""
    opener = _DIRECT if is_loopback(host) else urllib.request.build_opener()
    response: HTTPResponse = opener.open(request, timeout=timeout)
    return response
