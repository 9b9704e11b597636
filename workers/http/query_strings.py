"""A request's query string must be UTF-8 once percent-decoded, and name a single-valued parameter once.

Starlette decodes query parameters with ``errors="replace"``: ``path=caf%E9.txt`` (a Latin-1 name) would arrive
as ``caf\\ufffd.txt``, and so would ``caf%E8.txt``, so two different names would publish one path and the second
upload replace the first. And FastAPI takes the last of a repeated parameter: ``?path=a.md&path=b.md`` published
``b.md`` alone. Both are refused instead (422), naming the parameter; nothing is read or published.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from fastapi import Request

from shardfuse.workers.http.errors import ApiError


def utf8_query_string(request: Request) -> None:
    """Refuse (422 ``invalid_request``) a query parameter whose name or value is not UTF-8 once
    percent-decoded, as the form encoding reads it (``+`` is a space)."""
    raw: bytes = request.scope.get("query_string", b"")
    for part in raw.split(b"&"):
        name, _, value = part.partition(b"=")
        for piece in (name, value):
            try:
                unquote_to_bytes(piece.replace(b"+", b" ")).decode("utf-8")
            except UnicodeDecodeError as exc:
                shown = unquote_to_bytes(name.replace(b"+", b" ")).decode("utf-8", "replace")
                raise ApiError(
                    422, "invalid_request",
                    f"query parameter {shown!r} is not UTF-8 once percent-decoded ({exc.reason} at byte "
                    f"{exc.start}): percent-encode the text's UTF-8 bytes (é is %C3%A9)", fields=[shown],
                ) from None


def given_once(*names: str) -> Callable[[Request], None]:
    """A dependency refusing (422 ``invalid_request``) a request that gives one of ``names`` more than once."""

    def check(request: Request) -> None:
        for name in names:
            if (count := len(request.query_params.getlist(name))) > 1:
                raise ApiError(422, "invalid_request", f"query parameter {name!r} is given {count} times: give it "
                               "once (one document a request)", fields=[name])

    return check
