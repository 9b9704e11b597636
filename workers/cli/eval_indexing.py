"""Indexing a corpus for an evaluation (``shardfuse eval``, ``shardfuse eval-code``): publish its documents to a
zone through the running stack, unless the zone already holds them, and wait until every one is settled and
the BM25 indexes have caught up."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from tqdm import tqdm

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.index.store import ShardPools, ShardStore
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.workers import monitor
from shardfuse.workers.publishing import CeleryEventSink


def index_documents(
    documents: Sequence[tuple[str, bytes]], *, name: str, zone: str, settings: Settings, republish: bool,
    timeout: float,
) -> None:
    """Publish ``documents`` (``(path, content)`` pairs of the corpus ``name``) to ``zone`` unless it already
    holds as many settled documents, then wait up to ``timeout`` seconds for them and for the BM25 indexes."""
    with ShardPools(settings, min_size=1, max_size=2) as pools:
        stores = pools.stores()
        total = len(documents)
        if republish or settled(stores, zone) != total:
            with CeleryEventSink.connect(settings) as sink:
                publisher = Publisher(cas=open_content_store(settings), sink=sink)
                for path, content in tqdm(documents, desc=f"publishing {name} to zone {zone}", unit="doc"):
                    publisher.write(zone=zone, path=path, data=content)
        else:
            print(f"zone {zone!r} already holds the {total} documents of {name}; not republishing "
                  "(--republish to force)", file=sys.stderr)
        deadline = time.monotonic() + timeout
        with tqdm(total=total, desc="indexing", unit="doc") as bar:
            while (done := settled(stores, zone)) < total:
                bar.update(done - bar.n)
                if time.monotonic() > deadline:
                    raise ConfigurationError(f"only {done} of {total} documents were indexed within {timeout:g}s")
                time.sleep(1)
            bar.update(total - bar.n)
        if not monitor.wait_until_indexed(settings, timeout=max(1.0, deadline - time.monotonic())):
            raise ConfigurationError("the BM25 indexes did not catch up in time (see `shardfuse status`)")


def settled(stores: list[ShardStore], zone: str) -> int:
    """Documents of ``zone`` that reached a final state (indexed or skipped)."""
    return sum(row["documents"] + row["skipped"] for s in stores for row in s.zone_counts() if row["zone"] == zone)
