"""The tests' port slots (tests/integration/ports.py): pytest-xdist workers and the fault tests' pytest, which
``make test`` runs side by side, draw loopback ports from ranges that never overlap."""

from __future__ import annotations

from tests.integration.ports import ALL_PORTS, _slot_range


def test_each_xdist_worker_and_a_plain_pytest_draw_from_ranges_of_their_own() -> None:
    ranges = [_slot_range(None), _slot_range("gw0"), _slot_range("gw1"), _slot_range("gw2")]
    assert len(set(ranges)) == 4
    for (low, high), (other_low, other_high) in zip(sorted(ranges), sorted(ranges)[1:], strict=False):
        assert low < high <= other_low < other_high
    assert all(ALL_PORTS[0] <= low and high <= ALL_PORTS[1] and high - low >= 3000 for low, high in ranges)


def test_more_workers_than_slots_share_a_worker_slot_never_the_plain_one() -> None:
    assert _slot_range("gw3") == _slot_range("gw0")
    assert _slot_range("gw3") != _slot_range(None)
    for name in ("master", "12", "gw", "gwx"):
        assert _slot_range(name) == _slot_range(None), name
