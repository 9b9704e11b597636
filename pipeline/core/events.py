"""The write event: the one message that enters shardfuse, validated at the edge.

``{event_id, op: "write"|"delete", zone, path, content_hash: "sha256:<64 hex>", size, mime?, seq, metadata?}``

Everything an event names ends up in PostgreSQL (``text``, ``bigint`` and ``jsonb`` columns), so validation
refuses here, with a reason a person can act on, what those columns would refuse later: NUL characters and
lone surrogates in any string, integers beyond 64 bits, non-finite numbers and non-JSON values in
``metadata``. Paths are otherwise kept exactly as given (no Unicode normalisation: two spellings of "é" are
two files, as on the filesystem they came from). ``seq`` and ``size`` must be JSON integers: ``"7"``,
``7.0`` and ``true`` are refused rather than guessed at.
"""

from __future__ import annotations

import enum
import math
import re
import uuid
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shardfuse.pipeline.core.errors import InvalidEventError
from shardfuse.pipeline.core.text_checks import bad_character, quoted
from shardfuse.pipeline.core.validation_errors import field_problems
from shardfuse.pipeline.core.zones import Zone

HASH_PATTERN = r"^sha256:[0-9a-f]{64}$"
# PostgreSQL's bigint, where seq and size are stored.
MAX_BIGINT = 2**63 - 1
# Nesting deeper than this in metadata is refused (a filterable tag set, not a document store).
MAX_METADATA_DEPTH = 32

Count = Annotated[int, Strict(), Field(ge=0, le=MAX_BIGINT)]


class Op(enum.StrEnum):
    WRITE = "write"
    DELETE = "delete"


class WriteEvent(BaseModel):
    """One write or delete of ``(zone, path)`` in the content-addressed store.

    ``seq`` orders events of one ``(zone, path)``: the index applies an event only if its ``seq`` is
    newer than what it holds (last writer wins; deletes leave a tombstone). Constructing one with bad
    fields raises :class:`InvalidEventError` (as :func:`parse_event` does), not pydantic's error.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1, max_length=200)
    op: Op
    zone: Zone
    path: str = Field(min_length=1, max_length=4096)
    content_hash: str | None = None
    size: Count = 0
    mime: str | None = Field(default=None, max_length=255)
    seq: Count
    metadata: dict[str, Any] | None = None

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidEventError(describe(exc)) from exc

    @field_validator("content_hash")
    @classmethod
    def _check_hash(cls, content_hash: str | None) -> str | None:
        if content_hash is not None and not re.fullmatch(HASH_PATTERN, content_hash):
            raise ValueError(f"{quoted(content_hash)} is not a content hash: 'sha256:' followed by 64 lowercase "
                             "hex digits, as the CAS names content")
        return content_hash

    # Before pydantic's own checks, whose message for a lone surrogate is "unable to parse raw data".
    @field_validator("event_id", "path", "mime", mode="before")
    @classmethod
    def _check_text(cls, value: object, info: ValidationInfo) -> object:
        problem = bad_character(value) if isinstance(value, str) else None
        if problem:
            # A file name that is not UTF-8 reaches Python as lone surrogates (os.fsdecode).
            hint = "; rename the file to valid UTF-8" if info.field_name == "path" and "surrogate" in problem else ""
            raise ValueError(f"contains {problem}{hint}")
        return value

    @field_validator("metadata", mode="before")
    @classmethod
    def _check_metadata(cls, metadata: object) -> object:
        if isinstance(metadata, dict):
            _check_json(metadata, "", depth=0)
        return metadata

    @model_validator(mode="after")
    def _check_op_fields(self) -> WriteEvent:
        if self.op is Op.WRITE and self.content_hash is None:
            raise ValueError("a write event needs content_hash")
        return self

    @property
    def key(self) -> tuple[str, str]:
        return (self.zone, self.path)


def _check_json(value: object, where: str, *, depth: int) -> None:
    """``value`` is what a ``jsonb`` column stores; ``ValueError`` naming the first place (``where``: ``a[1].b``)
    that is not."""
    if depth > MAX_METADATA_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_METADATA_DEPTH} levels")
    if isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value}, which JSON cannot hold; use a finite number or a string")
    elif isinstance(value, dict):
        _check_json_object(value, where, depth=depth)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]", depth=depth + 1)
    elif value is not None and not isinstance(value, bool | int):
        raise ValueError(f"{where} is a {type(value).__name__}; metadata holds only JSON values (strings, "
                         "numbers, booleans, null, lists and objects)")


def _check_json_object(value: dict[Any, Any], where: str, *, depth: int) -> None:
    """:func:`_check_json` of an object: its keys are strings a ``jsonb`` column takes, its values JSON."""
    for key, item in value.items():
        label = f"{where}: key {quoted(key)}" if where else f"key {quoted(key)}"
        if not isinstance(key, str):
            raise ValueError(f"{label} is not a string")
        _check_text(key, label)
        _check_json(item, f"{where}.{key}" if where else key, depth=depth + 1)


def _check_text(text: str, label: str) -> None:
    """``ValueError`` naming ``label`` if ``text`` holds a character PostgreSQL's text refuses."""
    problem = bad_character(text)
    if problem:
        raise ValueError(f"{label} contains {problem}")


def describe(exc: ValidationError) -> str:
    """Every problem pydantic found, one ``field: problem`` each, as an :class:`InvalidEventError` says it."""
    return "invalid write event: " + field_problems(exc, whole="event")


def parse_event(raw: object) -> WriteEvent:
    """Validate a raw event (JSON text or a decoded dict); raise :class:`InvalidEventError` with every
    problem listed, so the dead-letter reason says exactly what to fix."""
    if not isinstance(raw, str | bytes | dict):
        raise InvalidEventError(f"invalid write event: an event is a JSON object (or its JSON text), "
                                f"not {type(raw).__name__} {quoted(raw)}")
    try:
        if isinstance(raw, dict):
            return WriteEvent.model_validate(raw)
        return WriteEvent.model_validate_json(raw)
    except ValidationError as exc:
        raise InvalidEventError(describe(exc)) from exc


def hex_digest(content_hash: str) -> str:
    """The 64 hex characters of a ``sha256:<hex>`` hash, checked (no path traversal can pass)."""
    if not isinstance(content_hash, str) or not re.fullmatch(HASH_PATTERN, content_hash):
        raise InvalidEventError(f"content hash {quoted(content_hash)} is not 'sha256:' followed by 64 lowercase "
                                "hex digits")
    return content_hash.removeprefix("sha256:")
