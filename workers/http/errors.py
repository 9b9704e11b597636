"""Every error the HTTP API answers, as ``{"error": {"code": ..., "message": ...}}``.

The messages are our exceptions' own, the ones the CLI prints after ``shardfuse <command>:`` for the same bad
input (a search's :class:`InvalidQueryError`, an upload's :class:`InvalidEventError`), so a script and a person
at a terminal read the same words. A refused request names its fields (``"fields": ["k"]``) where it can.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from shardfuse.pipeline.core.errors import (
    ConfigurationError,
    InvalidEventError,
    InvalidQueryError,
    ShardfuseError,
    StoreUnavailableError,
    TransientError,
)

log = logging.getLogger(__name__)

# The error codes, by HTTP status, for the statuses starlette raises itself (404, 405, ...).
_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          413: "too_large", 415: "unsupported_media_type", 422: "invalid_request", 429: "rate_limited",
          503: "unavailable"}


class ApiError(Exception):
    """An answer other than success: its status, code and message (and headers, fields)."""

    def __init__(self, status: int, code: str, message: str, *, headers: Mapping[str, str] | None = None,
                 fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.fields = list(fields)

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.fields:
            body["fields"] = self.fields
        return JSONResponse({"error": body}, status_code=self.status, headers=self.headers)


def invalid(exc: ShardfuseError) -> ApiError:
    """A refused search or event as a 422 naming the fields pydantic found wrong (the validation error is the
    cause of ours: :func:`shardfuse.query.request.parse_request` raises ``from`` it)."""
    cause = exc.__cause__
    fields = (sorted({str(err["loc"][0]) for err in cause.errors() if err["loc"]})
              if isinstance(cause, ValidationError) else [])
    return ApiError(422, "invalid_request", str(exc), fields=fields)


def from_shardfuse(exc: ShardfuseError) -> ApiError:
    """One of our errors, as the API answers it."""
    if isinstance(exc, InvalidQueryError | InvalidEventError):
        return invalid(exc)
    if isinstance(exc, StoreUnavailableError | TransientError):
        return ApiError(503, "unavailable", str(exc), headers={"Retry-After": "5"})
    if isinstance(exc, ConfigurationError):
        return ApiError(500, "configuration", str(exc))
    return ApiError(422, "refused", str(exc))


def install(app: FastAPI) -> None:
    """Answer every error in the one JSON shape."""

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def shardfuse_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ShardfuseError)
        return from_shardfuse(exc).response()

    async def request_validation(_: Request, exc: Exception) -> JSONResponse:
        # FastAPI's own checks of query parameters (a missing zone or path, a repeated one).
        assert isinstance(exc, RequestValidationError)
        problems = [f"{'.'.join(str(p) for p in err['loc'][1:]) or err['loc'][0]}: {err['msg']}"
                    for err in exc.errors()]
        fields = sorted({str(err["loc"][-1]) for err in exc.errors() if err["loc"]})
        return ApiError(422, "invalid_request", "; ".join(problems), fields=fields).response()

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return ApiError(exc.status_code, _CODES.get(exc.status_code, "error"), str(exc.detail),
                        headers=exc.headers).response()

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error answering a request")
        return ApiError(500, "internal", f"internal error ({type(exc).__name__}); see the API's log").response()

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(ShardfuseError, shardfuse_error)
    app.add_exception_handler(RequestValidationError, request_validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
