"""Reindexing a zone to a new embedding model on the real embedded stack: side by side while writes and
queries go on, then an atomic switch (``shardfuse reindex``; the stack's workers know a second model,
``mini``: 48-dimensional hashing, beside the default 384-dimensional one)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pytest

from shardfuse.pipeline.embed.batcher import FILL_TTL_S
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

TOPICS = ["glacier", "volcano", "estuary", "savanna", "tundra", "lagoon", "canyon", "steppe"]


def _publish(stack: Stack, zone: str, names: list[str]) -> None:
    with stack.publisher() as publisher:
        for name in names:
            publisher.write(zone=zone, path=f"{name}.txt",
                            data=f"field notes on the {name}: the {name} landscape and its {name} wildlife".encode())


def _vectors(stack: Stack, zone: str) -> dict[str, tuple[bool, bool]]:
    """Per chunk of the zone (every shard): (has a default vector, has a mini vector)."""
    seen: dict[str, tuple[bool, bool]] = {}
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        for shard in range(stack.settings.shards):
            rows = conn.execute(
                f"SELECT path, embedding IS NOT NULL, embedding_mini IS NOT NULL FROM shard_{shard}.chunks "
                "WHERE zone = %s", (zone,)).fetchall()
            seen.update({path: (bool(d), bool(m)) for path, d, m in rows})
    return seen


class QueryLoop(threading.Thread):
    """A user searching the zone over and over through the RPC while the reindex runs."""

    def __init__(self, stack: Stack, zone: str) -> None:
        super().__init__(daemon=True)
        self.stack, self.zone = stack, zone
        self.answers: list[tuple[str, int]] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                answer = self.stack.search("canyon landscape", self.zone, mode="semantic", k=3, cache=False)
                self.answers.append((answer["model"], len(answer["results"])))
            except Exception as exc:  # noqa: BLE001 - recorded for the assertions
                self.errors.append(exc)


def test_a_zone_moves_to_a_new_model_side_by_side_and_switches_at_once(stack: Stack) -> None:
    zone = f"reindex-{uuid.uuid4().hex[:8]}"
    _publish(stack, zone, TOPICS[:5])
    stack.wait()
    loop = QueryLoop(stack, zone)
    loop.start()
    try:
        start = stack.cli("reindex", "start", "--zone", zone, "--model", "mini")
        assert "ready" in start.stdout
        # Writes after the start carry both models: no backfill needed for them.
        _publish(stack, zone, TOPICS[5:7])
        stack.wait()
        assert set(_vectors(stack, zone).values()) == {(True, True)}
        status = json.loads(stack.cli("reindex", "status", "--zone", zone, "--json").stdout.strip().splitlines()[-1])
        (entry,) = status["zones"]
        assert (entry["active"], entry["target"]) == ("default", "mini")
        assert all(s["missing"] == 0 and s["index"] for s in entry["shards"])

        # Side by side: the zone still answers with its own model; the new one can be tried by name.
        assert stack.search("canyon landscape", zone, mode="semantic", k=1)["model"] == "default"
        trial = stack.search("canyon landscape", zone, mode="semantic", k=1, model="mini")
        assert trial["model"] == "mini" and trial["results"][0]["path"] == "canyon.txt"

        switched = stack.cli("reindex", "switch", "--zone", zone, "--model", "mini")
        assert "now searches with mini" in switched.stdout
        answer = stack.search("canyon landscape", zone, mode="semantic", k=1)
        assert answer["model"] == "mini" and answer["results"][0]["path"] == "canyon.txt"
    finally:
        loop.stop.set()
        loop.join(timeout=60)
    # No downtime, and the switch is atomic: every answer came from one model and had results, and once an
    # answer came from the new model none came from the old one again.
    assert not loop.errors, loop.errors[:3]
    models = [m for m, _ in loop.answers]
    assert len(models) >= 5 and all(n > 0 for _, n in loop.answers)
    assert models[0] == "default" and models[-1] == "mini"
    assert "default" not in models[models.index("mini"):]

    # Until `finish`, both models are still written (switching back stays instant); after it, only the new one.
    _publish(stack, zone, ["before_finish"])
    stack.wait()
    assert _vectors(stack, zone)["before_finish.txt"] == (True, True)
    stack.cli("reindex", "finish", "--zone", zone, "--model", "mini")
    time.sleep(FILL_TTL_S + 0.5)  # the embed workers read the zone's models again (writing both is only waste)
    _publish(stack, zone, ["after_finish"])
    stack.wait()
    assert _vectors(stack, zone)["after_finish.txt"] == (False, True)
    after = stack.search("after_finish landscape", zone, mode="hybrid", k=3)
    assert after["model"] == "mini" and any(r["path"] == "after_finish.txt" for r in after["results"])


def test_reindex_steps_refuse_what_makes_no_sense_with_clear_errors(stack: Stack) -> None:
    zone = f"reindex-bad-{uuid.uuid4().hex[:8]}"
    _publish(stack, zone, TOPICS[:2])
    stack.wait()
    unknown = stack.cli("reindex", "start", "--zone", zone, "--model", "nope", check=False)
    assert unknown.returncode == 2 and "'nope' is not configured" in unknown.stderr
    early = stack.cli("reindex", "switch", "--zone", zone, "--model", "mini", check=False)
    assert early.returncode == 2 and "not being reindexed to 'mini'" in early.stderr
    same = stack.cli("reindex", "start", "--zone", zone, "--model", "default", check=False)
    assert same.returncode == 2 and "already uses model 'default'" in same.stderr
    # Started, then given up: writes go back to the zone's model alone, and nothing else changed.
    stack.cli("reindex", "start", "--zone", zone, "--model", "mini")
    stack.cli("reindex", "abort", "--zone", zone, "--model", "mini")
    _publish(stack, zone, ["later"])
    stack.wait()
    assert _vectors(stack, zone)["later.txt"] == (True, False)
    assert stack.search("glacier", zone, mode="semantic", k=1)["model"] == "default"

