"""``GET /v1/status`` (what ``shardfuse status`` shows, scoped to the key's zones), ``GET /healthz`` (the process
answers) and ``GET /readyz`` (the broker, PostgreSQL and the CAS answer; 503 otherwise). The probes need no key:
Kubernetes and compose call them without one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from shardfuse.pipeline.admin.api_keys import ApiKey
from shardfuse.pipeline.config.api import ALL_ZONES
from shardfuse.pipeline.core.zones import check_zone
from shardfuse.workers.http.auth import Caller, require_read, services
from shardfuse.workers.http.errors import ApiError
from shardfuse.workers.stack.launcher import read_state
from shardfuse.workers.status import collect_status

router = APIRouter()

# What a key limited to some zones sees of the status: the deployment's health (queues, index freshness, the
# counters) and its zones' rows; not the addresses, processes and log files, nor other zones' documents and
# failures (the set-aside messages' reasons and the dead-letter total may name any zone, so they are left out).
SHARED_KEYS = ("shards", "queues", "held_by_dead_workers", "unreadable_messages", "bm25", "metrics",
               "vector_index_deferred", "broker_error", "database_error")


def scoped_status(status: dict[str, Any], zones: set[str] | None) -> dict[str, Any]:
    """``status`` as a key reading ``zones`` (None: every zone, as ``shardfuse status`` shows it) may see it."""
    if zones is None:
        return status
    view = {key: status[key] for key in SHARED_KEYS if key in status}
    view["zones"] = sorted(zones)
    if "shard_counts" in status:
        view["shard_counts"] = [{"shard": shard["shard"], "zones": [z for z in shard["zones"] if z["zone"] in zones]}
                                for shard in status["shard_counts"]]
    for key in ("skipped", "failed"):
        if key in status:
            view[key] = [row for row in status[key] if row.get("zone") in zones]
    return view


def _zones_shown(key: ApiKey, asked: list[str] | None) -> set[str] | None:
    if asked:
        for zone in asked:
            try:
                check_zone(zone)
            except ValueError as exc:
                raise ApiError(422, "invalid_request", f"zone {exc}", fields=["zone"]) from exc
        require_read(key, asked)
        return set(asked)
    return None if ALL_ZONES in key.read else set(key.read)


@router.get("/v1/status", tags=["status"], responses={
    401: {"description": "no key, or an unknown one"}, 403: {"description": "a zone the key may not read"}})
async def status(request: Request, key: Caller, zone: Annotated[list[str] | None, Query(
        description="the zones to show (repeatable); default: every zone the key may read")] = None) -> dict[str, Any]:
    """Queues, index freshness, counters, and the shards' documents of the zones asked for."""
    held = services(request)
    shown = _zones_shown(key, zone)
    full = await run_in_threadpool(collect_status, held.settings, state=read_state(held.settings))
    return scoped_status(full, shown)


@router.get("/healthz", tags=["probes"])
async def healthz() -> dict[str, str]:
    """The process is alive and serving."""
    return {"status": "ok"}


@router.get("/readyz", tags=["probes"], responses={503: {"description": "a store does not answer"}})
async def readyz(request: Request) -> JSONResponse:
    """Ready when the broker, PostgreSQL and the CAS answer; 503 (with what does not) otherwise."""
    checks = await run_in_threadpool(services(request).readiness)
    ready = all(answer == "ok" for answer in checks.values())
    return JSONResponse({"status": "ready" if ready else "not ready", "checks": checks},
                        status_code=200 if ready else 503)
