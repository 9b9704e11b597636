"""The entropy filter on a code corpus with shared boilerplate, side by side with the filter off.

500 Python files, each starting with the same 15-line licence header, each holding the same copied
``_configure_logging`` helper and, twice, the same retry loop, plus two functions of its own, are published
into a stack whose embedder is the fake OpenAI server (which records every input it embeds). The same
corpus runs once with ``entropy.enabled = false`` and once with ``true``. Reported: chunks indexed, chunks
dropped by reason, inputs embedded, and how many embedded inputs hold the licence header (the issue asks for
at most one). The last line is JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import Stack, running_stack
from tests.support.embeddings_server import FakeEmbeddingsServer

FILES = 500
DIMENSIONS = 64
LICENCE = "".join(
    f"# {line}\n" for line in [
        "Copyright (c) 2026 Example Corp. All rights reserved.", "",
        'Licensed under the Apache License, Version 2.0 (the "License");',
        "you may not use this file except in compliance with the License.",
        "You may obtain a copy of the License at", "", "    http://www.apache.org/licenses/LICENSE-2.0", "",
        "Unless required by applicable law or agreed to in writing, software",
        'distributed under the License is distributed on an "AS IS" BASIS,',
        "WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.",
        "See the License for the specific language governing permissions and",
        "limitations under the License.", "", "SPDX-License-Identifier: Apache-2.0",
    ]
)  # fmt: skip
BOILERPLATE = '''import logging
import time

log = logging.getLogger(__name__)


def _configure_logging(level=logging.INFO):
    """Send this module's records to stderr with a timestamp."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
'''
RETRY = '''

def {name}(call, attempts=5):
    """Call ``call`` until it succeeds, waiting longer after each failure."""
    for attempt in range(attempts):
        try:
            return call()
        except ConnectionError:
            time.sleep(2 ** attempt)
    raise RuntimeError("gave up")
'''


def _file(i: int) -> str:
    own = f'''

def load_sensor_{i}(path):
    """Read sensor {i}'s calibration table: one "offset,gain" pair per line."""
    with open(path) as handle:
        return [tuple(float(v) for v in line.split(",")) for line in handle if line.strip()]


def scale_reading_{i}(raw, table):
    """Apply sensor {i}'s calibration to a raw reading of {i * 7 % 97} counts."""
    offset, gain = table[{i} % len(table)]
    return (raw - offset) * gain * {1 + i % 13}
'''
    # The retry loop twice under the same name: a duplicate within the file.
    return LICENCE + BOILERPLATE + own + RETRY.format(name="with_retries") + RETRY.format(name="with_retries")


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeEmbeddingsServer]:
    with FakeEmbeddingsServer(dimensions=DIMENSIONS) as server:
        yield server


def _run(provider: FakeEmbeddingsServer, *, filtered: bool) -> dict[str, Any]:
    overrides = {
        "SHARDFUSE_SHARDS": "2",
        "SHARDFUSE_EMBEDDER__PROVIDER": "openai",
        "SHARDFUSE_EMBEDDER__MODEL": "text-embedding-3-small",
        "SHARDFUSE_EMBEDDER__DIMENSIONS": str(DIMENSIONS),
        "SHARDFUSE_EMBEDDER__API_KEY": "sk-bench",
        "SHARDFUSE_EMBEDDER__BASE_URL": provider.base_url,
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.5",
        "SHARDFUSE_ENTROPY__ENABLED": "true" if filtered else "false",
    }
    zone = "licensed"
    with running_stack(overrides) as stack:
        before = len(provider.embedding_requests())
        with stack.publisher() as publisher:
            for i in range(FILES):
                publisher.write(zone=zone, path=f"sensors/sensor_{i:03d}.py", data=_file(i).encode())
        stack.wait(timeout=900)
        inputs = [text for request in provider.embedding_requests()[before:] for text in request.json["input"]]
        zones = _zone_status(stack, zone)
    return {
        "documents": zones["documents"],
        "chunks": zones["chunks"],
        "dropped": zones.get("dropped", {}),
        "embedded_inputs": len(inputs),
        "licence_embedded": sum("Licensed under the Apache License" in text for text in inputs),
    }


def _zone_status(stack: Stack, zone: str) -> dict[str, Any]:
    """The zone's documents, chunks and drops by reason, summed over the shards (from ``status --json``)."""
    status = json.loads(stack.cli("status", "--json").stdout)
    rows = [row for shard in status["shard_counts"] for row in shard["zones"] if row["zone"] == zone]
    dropped: Counter[str] = Counter()
    for row in rows:
        dropped.update(row.get("dropped", {}))
    return {"documents": sum(r["documents"] for r in rows), "chunks": sum(r["chunks"] for r in rows),
            "dropped": dict(dropped)}


def test_the_filter_drops_repeated_boilerplate_and_embeds_the_licence_once(provider: FakeEmbeddingsServer) -> None:
    off = _run(provider, filtered=False)
    on = _run(provider, filtered=True)
    print(f"\n{FILES} files with a shared 15-line licence, a copied helper and a duplicated retry loop")
    print(f"{'':<8}{'documents':>10}{'chunks':>8}{'embedded':>10}{'licence embedded':>18}  dropped")
    for name, run in (("off", off), ("on", on)):
        print(f"{name:<8}{run['documents']:>10}{run['chunks']:>8}{run['embedded_inputs']:>10}"
              f"{run['licence_embedded']:>18}  {run['dropped']}")
    print(json.dumps({"filter_off": off, "filter_on": on}))
    assert off["documents"] == on["documents"] == FILES
    assert on["licence_embedded"] <= 1
    assert sum(on["dropped"].values()) > 0
