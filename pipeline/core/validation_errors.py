"""Pydantic's validation errors as our one-line messages, for events and settings alike."""

from __future__ import annotations

from pydantic import ValidationError


def field_problems(exc: ValidationError, *, whole: str) -> str:
    """Every problem pydantic found, ``field: problem`` each (``whole`` names a problem of no one field),
    joined by ``; ``, and never the value that was given: pydantic's own text quotes each input, and an input
    may be a password, an API key or a URL holding one."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(part) for part in error["loc"]) or whole
        problems.append(f"{where}: {str(error['msg']).removeprefix('Value error, ')}")
    return "; ".join(problems)
