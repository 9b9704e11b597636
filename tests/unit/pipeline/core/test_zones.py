"""The zone rule (issue 19): one rule, one message, for the write event and the search request alike."""

from __future__ import annotations

import pytest

from shardfuse.pipeline.config.settings import QuerySettings
from shardfuse.pipeline.core.errors import InvalidEventError, InvalidQueryError
from shardfuse.pipeline.core.events import parse_event
from shardfuse.pipeline.core.zones import check_zone
from shardfuse.query.request import parse_request

RULE = "is not a zone name: 1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit"


@pytest.mark.parametrize("zone", ["", "../etc", "bad zone!", "z\n", "-z", ".hidden", "z" * 129, "zöne", None, 7],
                         ids=repr)
def test_a_bad_zone_is_refused_with_the_same_message_by_events_and_searches(zone: object) -> None:
    with pytest.raises(InvalidEventError) as event:
        parse_event({"op": "delete", "zone": zone, "path": "a.txt", "seq": 1})
    with pytest.raises(InvalidQueryError) as search:
        parse_request({"query": "q", "zone": zone}, settings=QuerySettings())
    with pytest.raises(ValueError, match="is not a zone name") as rule:
        check_zone(zone)
    assert RULE in str(rule.value)
    assert f"zone: {rule.value}" in str(event.value)  # the event names the field pydantic-style
    assert str(search.value) == f"zone {rule.value}"  # the search names the argument in its sentence


@pytest.mark.parametrize("zone", ["z", "Z9", "team-a.docs_v2", "0" * 128])
def test_good_zones_pass_both(zone: str) -> None:
    assert parse_event({"op": "delete", "zone": zone, "path": "a.txt", "seq": 1}).zone == zone
    assert parse_request({"query": "q", "zone": zone}, settings=QuerySettings()).zone == zone
