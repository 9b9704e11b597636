"""Who is calling and what they may touch: the API key (401 without a known one), its rate limit (429), and its
zones (403 for a zone it may not read or write, on every endpoint)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shardfuse.pipeline.admin.api_keys import ApiKey
from shardfuse.pipeline.core.text_checks import quoted
from shardfuse.workers.http.errors import ApiError
from shardfuse.workers.http.services import Services

bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey",
                    description="An API key (`shardfuse api-key create`), as `Authorization: Bearer <token>`.")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def services(request: Request) -> Services:
    """The process's services (built by the app's lifespan)."""
    held: Services = request.app.state.services
    return held


async def caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> ApiKey:
    """The key the request carries, once it has a token left in its bucket."""
    held = services(request)
    if credentials is None:
        raise ApiError(401, "unauthorized", "no API key: send the header 'Authorization: Bearer <token>' "
                       "(`shardfuse api-key create` makes a key)", headers=_CHALLENGE)
    key = await run_in_threadpool(held.keys.authenticate, credentials.credentials)
    if key is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key", headers=_CHALLENGE)
    if held.limiter is not None:
        decision = await run_in_threadpool(held.limiter.take, key.key_id)
        if not decision.allowed:
            raise ApiError(429, "rate_limited",
                           f"API key {key.name!r} is over its rate limit ({held.settings.api.rate_per_s:g} "
                           f"requests/s, bursts of {held.settings.api.burst}); retry after "
                           f"{decision.retry_after_header}s", headers={"Retry-After": decision.retry_after_header})
    return key


Caller = Annotated[ApiKey, Depends(caller)]


def require_read(key: ApiKey, zones: Iterable[str]) -> None:
    """403 unless ``key`` may read every one of ``zones``."""
    _require(key, [zone for zone in zones if not key.may_read(zone)], "read")


def require_write(key: ApiKey, zone: str) -> None:
    """403 unless ``key`` may write ``zone``."""
    _require(key, [] if key.may_write(zone) else [zone], "write")


def _require(key: ApiKey, denied: list[str], what: str) -> None:
    if denied:
        names = ", ".join(quoted(zone) for zone in denied)
        raise ApiError(403, "forbidden", f"API key {key.name!r} may not {what} zone {names}")
