from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from shardfuse.pipeline.core.sharding import shard_for


def test_placement_is_stable_across_processes() -> None:
    here = [shard_for("zone", f"path/{i}", 7) for i in range(50)]
    code = ("from shardfuse.pipeline.core.sharding import shard_for; "
            "print([shard_for('zone', f'path/{i}', 7) for i in range(50)])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert str(here) == other.strip()


def test_placement_spreads_documents_and_separates_zone_from_path() -> None:
    counts = Counter(shard_for("z", f"file_{i}.py", 4) for i in range(4000))
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 800
    # ("ab", "c") and ("a", "bc") are different documents and must hash independently.
    assert [shard_for("ab", f"c{i}", 1000) for i in range(20)] != [shard_for("a", f"bc{i}", 1000) for i in range(20)]
    with pytest.raises(ValueError):
        shard_for("z", "p", 0)
