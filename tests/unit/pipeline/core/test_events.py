from __future__ import annotations

import json

import pytest

from shardfuse.pipeline.core.errors import InvalidEventError
from shardfuse.pipeline.core.events import Op, hex_digest, parse_event

HASH = "sha256:" + "ab" * 32


def _event(**overrides: object) -> dict[str, object]:
    event: dict[str, object] = {"event_id": "e1", "op": "write", "zone": "z", "path": "a/b.py",
                                "content_hash": HASH, "size": 3, "seq": 7}
    event.update(overrides)
    return event


def test_valid_write_and_delete_parse() -> None:
    write = parse_event(json.dumps(_event()))
    assert write.op is Op.WRITE and write.key == ("z", "a/b.py") and write.seq == 7
    delete = parse_event({"op": "delete", "zone": "z", "path": "a/b.py", "seq": 8})
    assert delete.op is Op.DELETE and delete.content_hash is None and delete.event_id


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"op": "rename"}, "op"),
        ({"zone": ""}, "zone"),
        ({"zone": "../etc"}, "zone"),
        ({"content_hash": "sha256:xyz"}, "content_hash"),
        ({"content_hash": "sha256:" + "../" * 21 + "a"}, "content_hash"),
        ({"content_hash": None}, "content_hash"),
        ({"seq": -1}, "seq"),
        ({"seq": "seven"}, "seq"),
        ({"size": -5}, "size"),
        ({"path": ""}, "path"),
        ({"path": "a\x00b"}, "NUL"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_events_name_the_problem(overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidEventError, match=fragment):
        parse_event(_event(**overrides))


def test_missing_fields_and_malformed_json_are_invalid_events() -> None:
    with pytest.raises(InvalidEventError, match="zone"):
        parse_event({"op": "write", "path": "p", "content_hash": HASH, "seq": 1})
    with pytest.raises(InvalidEventError):
        parse_event("{not json")


def test_hex_digest_rejects_anything_but_64_hex() -> None:
    assert hex_digest(HASH) == "ab" * 32
    for bad in ("ab" * 32, "sha256:" + "AB" * 32, "sha256:../../etc/passwd", "sha256:" + "a" * 63):
        with pytest.raises(InvalidEventError):
            hex_digest(bad)
