"""``POST /v1/documents`` (upload) and ``DELETE /v1/documents``: a write or delete event, as ``shardfuse
publish`` / ``shardfuse delete`` publish them.

An upload is the raw body (any content type; ``curl --data-binary @file``), not a multipart form: it streams
into a spool file chunk by chunk with nothing to parse, and no form-parsing library is needed. It is counted
while it arrives (413 past ``api.max_upload_bytes``, nothing stored or published), then put in the CAS
(streamed, :meth:`~shardfuse.pipeline.storage.cas.ContentStore.put_file`), and only then is its event
published. Zone, path and metadata are query parameters, checked before a byte is read.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.admin.uploads import check_target, mime_for, publish_stored
from shardfuse.pipeline.core import json_depth
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.workers.http.auth import Caller, require_write, services
from shardfuse.workers.http.bodies import spool_upload
from shardfuse.workers.http.errors import ApiError
from shardfuse.workers.http.query_strings import given_once
from shardfuse.workers.http.services import Services

router = APIRouter(tags=["documents"])

Zone = Annotated[str, Query(description="the zone (tenant) of the document")]
DocPath = Annotated[str, Query(description="the document's path in its zone (what search results show)")]
_UPLOAD = {"requestBody": {"required": True, "description": "the document's content, as is",
                           "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "no key, or an unknown one"}, 403: {"description": "a zone the key may not write"},
    422: {"description": "a bad zone, path or metadata, named"}, 429: {"description": "over the rate limit"}}


class Accepted(BaseModel):
    """The published event's identity: the document is ``(zone, path)``; ``seq`` orders its events."""

    event_id: str
    op: str
    zone: str
    path: str
    seq: int
    content_hash: str | None = None  # "sha256:<64 hex>" of the content (writes)
    size: int = 0

    @classmethod
    def of(cls, event: WriteEvent) -> Accepted:
        return cls(event_id=event.event_id, op=event.op.value, zone=event.zone, path=event.path, seq=event.seq,
                   content_hash=event.content_hash, size=event.size)


def _metadata(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json_depth.loads(raw)
    except json_depth.TooDeepError as exc:
        raise ApiError(422, "invalid_request", f"metadata {exc}", fields=["metadata"]) from exc
    except ValueError as exc:
        raise ApiError(422, "invalid_request", f"metadata is not JSON: {exc}", fields=["metadata"]) from exc
    if not isinstance(value, dict):
        raise ApiError(422, "invalid_request", "metadata must be a JSON object", fields=["metadata"])
    return value


@router.post("/v1/documents", status_code=202, openapi_extra=_UPLOAD,
             dependencies=[Depends(given_once("zone", "path", "metadata"))],
             responses={**_ERRORS, 413: {"description": "content over api.max_upload_bytes; nothing published"}})
async def upload(request: Request, key: Caller, zone: Zone, path: DocPath,
                 metadata: Annotated[str | None, Query(description="a JSON object stored with the document "
                                                       "(search filters match it)")] = None) -> Accepted:
    """Store the body in the CAS and publish its write event."""
    held = services(request)
    meta = _metadata(metadata)
    check_target(zone=zone, path=path, metadata=meta)
    require_write(key, zone)
    with tempfile.TemporaryDirectory(prefix="shardfuse-upload-") as spool_dir:
        spool = Path(spool_dir) / "content"
        size = await spool_upload(request, spool, limit=held.max_upload_bytes)
        event = await run_in_threadpool(_store_and_publish, held, spool, zone=zone, path=path, size=size,
                                        mime=mime_for(path, request.headers.get("content-type")), metadata=meta)
    return Accepted.of(event)


def _store_and_publish(held: Services, spool: Path, *, zone: str, path: str, size: int, mime: str | None,
                       metadata: dict[str, Any] | None) -> WriteEvent:
    content_hash = held.cas.put_file(spool).content_hash
    with held.event_sink() as sink:
        return publish_stored(sink, zone=zone, path=path, content_hash=content_hash, size=size, mime=mime,
                              metadata=metadata)


@router.delete("/v1/documents", status_code=202, responses=_ERRORS, dependencies=[Depends(given_once("zone", "path"))])
async def delete(request: Request, key: Caller, zone: Zone, path: DocPath) -> Accepted:
    """Publish the delete of ``(zone, path)`` (a tombstone: a late write cannot bring it back)."""
    held = services(request)
    check_target(zone=zone, path=path)
    require_write(key, zone)
    return Accepted.of(await run_in_threadpool(_publish_delete, held, zone=zone, path=path))


def _publish_delete(held: Services, *, zone: str, path: str) -> WriteEvent:
    with held.event_sink() as sink:
        return Publisher(cas=held.cas, sink=sink).delete(zone=zone, path=path)
