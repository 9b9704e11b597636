"""``POST /v1/search``: a search through the ``shardfuse.search`` RPC task, so the query pool scales on its own.

The body is the task's arguments (:class:`~shardfuse.query.request.SearchRequest`: ``query``, ``zone`` or
``zones``, ``k``, ``mode`` ...). It is validated here first, with the query workers' own rules and messages
(:func:`~shardfuse.query.request.parse_request`), so a bad request is answered 422 without a round trip and
every zone it names is checked against the key before any worker sees it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from shardfuse.pipeline.core.errors import ShardfuseError
from shardfuse.query.request import parse_request
from shardfuse.workers.http.auth import Caller, require_read, services
from shardfuse.workers.http.bodies import read_json
from shardfuse.workers.http.errors import ApiError

router = APIRouter(tags=["search"])

# The body's schema is SearchRequest's own (added to the document's components by shardfuse.workers.http.app).
_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/SearchRequest"}}}}}


@router.post("/v1/search", openapi_extra=_BODY, responses={
    401: {"description": "no key, or an unknown one"}, 403: {"description": "a zone the key may not read"},
    413: {"description": "body over api.max_request_bytes"}, 422: {"description": "a bad argument, named"},
    429: {"description": "over the key's rate limit (Retry-After)"}})
async def search(request: Request, key: Caller) -> dict[str, Any]:
    """Search one zone (``zone``) or several as one (``zones``); the answer is the RPC task's: results with
    scores, ranks and timings."""
    held = services(request)
    arguments = await read_json(request, limit=held.settings.api.max_request_bytes)
    parsed = parse_request(arguments, settings=held.settings.query)
    require_read(key, parsed.zones)
    try:
        return await run_in_threadpool(held.searches.search, arguments)
    except ShardfuseError:
        raise  # the worker's refusal (rebuilt by Celery) or no worker answering: answered by its kind
    except Exception as exc:  # an error the worker raised that Celery could not rebuild as ours
        raise ApiError(502, "search_failed", f"the query worker failed: {exc}") from exc
