"""The write event: the one message that enters shardfuse, validated at the edge.

``{event_id, op: "write"|"delete", zone, path, content_hash: "sha256:<64 hex>", size, mime?, seq, metadata?}``
"""

from __future__ import annotations

import enum
import re
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from pipeline.errors import InvalidEventError

HASH_PATTERN = r"^sha256:[0-9a-f]{64}$"
_ZONE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"

Zone = Annotated[str, StringConstraints(pattern=_ZONE_PATTERN)]
ContentHash = Annotated[str, StringConstraints(pattern=HASH_PATTERN)]


class Op(enum.StrEnum):
    WRITE = "write"
    DELETE = "delete"


class WriteEvent(BaseModel):
    """One write or delete of ``(zone, path)`` in the content-addressed store.

    ``seq`` orders events of one ``(zone, path)``: the index applies an event only if its ``seq`` is
    newer than what it holds (last writer wins; deletes leave a tombstone).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1, max_length=200)
    op: Op
    zone: Zone
    path: str = Field(min_length=1, max_length=4096)
    content_hash: ContentHash | None = None
    size: int = Field(default=0, ge=0)
    mime: str | None = Field(default=None, max_length=255)
    seq: int = Field(ge=0)
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_op_fields(self) -> WriteEvent:
        if self.op is Op.WRITE and self.content_hash is None:
            raise ValueError("a write event needs content_hash")
        if "\x00" in self.path:
            raise ValueError("path contains a NUL character")
        return self

    @property
    def key(self) -> tuple[str, str]:
        return (self.zone, self.path)


def parse_event(raw: str | bytes | dict[str, Any]) -> WriteEvent:
    """Validate a raw event (JSON text or a decoded dict); raise :class:`InvalidEventError` with every
    problem listed, so the dead-letter reason says exactly what to fix."""
    try:
        if isinstance(raw, dict):
            return WriteEvent.model_validate(raw)
        return WriteEvent.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'event'}: {err['msg']}" for err in exc.errors()
        )
        raise InvalidEventError(f"invalid write event: {problems}") from exc


def hex_digest(content_hash: str) -> str:
    """The 64 hex characters of a ``sha256:<hex>`` hash, checked (no path traversal can pass)."""
    if not re.fullmatch(HASH_PATTERN, content_hash):
        raise InvalidEventError(f"content hash {content_hash!r} is not 'sha256:' followed by 64 hex digits")
    return content_hash.removeprefix("sha256:")
