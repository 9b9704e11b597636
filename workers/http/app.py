"""The HTTP API's ASGI application (FastAPI): search, upload, delete, status and the probes, behind API keys.

:func:`create_app` builds it from a :class:`~shardfuse.pipeline.config.settings.Settings`; the process's
services (key ring, rate limiter, RPC clients, CAS) are made when the server starts it (the lifespan), not at
import. The OpenAPI document is served at ``/openapi.json`` (and read at ``/docs``), with the search body's
schema being :class:`~shardfuse.query.request.SearchRequest`'s own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from shardfuse.pipeline.config.settings import Settings
from shardfuse.query.request import SearchRequest
from shardfuse.workers.http import document_routes, errors, search_routes, status_routes
from shardfuse.workers.http.query_strings import utf8_query_string
from shardfuse.workers.http.services import Services

TITLE = "shardfuse"
DESCRIPTION = ("Hybrid (BM25 + pgvector) search over a content-addressed store: search, upload and delete "
               "documents, and the index's status, with zone-scoped API keys. See docs/http-api.md.")


def create_app(settings: Settings, *, build: Callable[[Settings], Services] = Services.build) -> FastAPI:
    """The application; ``build`` makes its services when it starts (a test may hand in its own)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        held = build(settings)
        app.state.services = held
        try:
            yield
        finally:
            held.close()

    app = FastAPI(title=TITLE, version=_version(), description=DESCRIPTION, lifespan=lifespan,
                  dependencies=[Depends(utf8_query_string)])
    errors.install(app)
    for module in (search_routes, document_routes, status_routes):
        app.include_router(module.router)
    app.openapi = _openapi(app)  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema
    return app


def _version() -> str:
    try:
        return metadata.version("shardfuse")
    except metadata.PackageNotFoundError:  # a checkout that was never installed
        return "0+unknown"


def _openapi(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The generated document plus :class:`SearchRequest`'s schema (its enums included) in its components."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            request = SearchRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(request.pop("$defs", {}))
            # zones left out is filled from zone: its placeholder default (an empty list) is no value to send.
            request["properties"]["zones"].pop("default", None)
            components["SearchRequest"] = request
            app.openapi_schema = schema
        return app.openapi_schema

    return document
