"""The zone rule: what a zone (tenant) name may be, one rule and one message for write events and search
requests alike (a zone names a cache key, a log line and a BM25 mask entry, so no path separators, spaces or
control characters)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

from shardfuse.pipeline.core.text_checks import quoted

ZONE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


def check_zone(value: object) -> str:
    """``value`` if it is a zone name, else ``ValueError`` saying what a zone name is (pydantic reports it
    under the field's name)."""
    if isinstance(value, str) and ZONE_PATTERN.fullmatch(value):
        return value
    raise ValueError(f"{quoted(value)} is not a zone name: 1 to 128 letters, digits, '_', '.' or '-', "
                     "starting with a letter or digit")


# A pydantic field holding a zone name; anything else (another type included) fails with check_zone's message.
Zone = Annotated[str, BeforeValidator(check_zone)]
