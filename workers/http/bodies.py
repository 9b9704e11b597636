"""Request bodies read within their limits: a JSON request (``api.max_request_bytes``) and an upload's content
(``api.max_upload_bytes``), both counted as they arrive, so an oversize body is refused (413) after at most the
limit plus one chunk, whatever its ``Content-Length`` claims or when it has none (chunked transfer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from shardfuse.pipeline.core import json_depth
from shardfuse.workers.http.errors import ApiError


def _too_large(what: str, limit: int, setting: str, *, consequence: str = "") -> ApiError:
    return ApiError(413, "too_large", f"{what} is larger than {setting} ({limit:,} bytes){consequence}")


def _identity_encoded(request: Request, *, consequence: str = "") -> None:
    """415 for a body sent with a content coding (``gzip``, ``br``, …): bodies are read as they arrive, so a
    compressed upload would be stored as the document (and skipped later as binary), and compressed JSON would
    fail to parse with a message about bytes."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise ApiError(415, "unsupported_media_type",
                       f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed{consequence}")


def _declared_length(request: Request) -> int | None:
    try:
        return int(request.headers["content-length"])
    except (KeyError, ValueError):
        return None


async def read_json(request: Request, *, limit: int) -> dict[str, Any]:
    """The body as a JSON object: 413 past ``limit`` bytes; 422 naming ``body`` if it is not JSON or not an object
    (FastAPI's own status for a body it cannot parse); 415 for a compressed one."""
    _identity_encoded(request)
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise _too_large("the request body", limit, "api.max_request_bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large("the request body", limit, "api.max_request_bytes")
    try:
        data = json_depth.loads(body)
    except json_depth.TooDeepError as exc:
        raise ApiError(422, "invalid_json", f"the request body {exc}", fields=["body"]) from exc
    except ValueError as exc:  # UnicodeDecodeError included
        raise ApiError(422, "invalid_json", f"the request body is not JSON: {exc}", fields=["body"]) from exc
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_request", f"the request body must be a JSON object, not {type(data).__name__}",
                       fields=["body"])
    return data


async def spool_upload(request: Request, target: Path, *, limit: int) -> int:
    """Write the body to ``target`` as it arrives (memory: one chunk); return its size. 413 past ``limit``
    bytes, with ``target`` left partial for the caller to discard; 415 for a compressed body."""
    _identity_encoded(request, consequence="; nothing was published")
    refused = _too_large("the upload", limit, "api.max_upload_bytes", consequence="; nothing was published")
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise refused
    size = 0
    out = await run_in_threadpool(open, target, "wb")
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise refused
            await run_in_threadpool(out.write, chunk)
    finally:
        await run_in_threadpool(out.close)
    return size
