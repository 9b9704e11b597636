"""psycopg's errors become ours where they arise (shardfuse.pipeline.index.store.connections): every
PostgreSQL adapter reached with nothing listening on its port raises a StoreUnavailableError that names
what and where (host:port/dbname, never the password) and chains psycopg's error. No server is needed: the
DSNs point at a closed loopback port."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import errors, pq
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.admin.dead_letters import dead_letter_count, record_dead_letter
from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.core.errors import SchemaMissingError, StoreUnavailableError, TransientError
from shardfuse.pipeline.index.store import EmbeddingCache, ShardStore, open_pool
from shardfuse.pipeline.index.store.connections import postgres_location, translated
from shardfuse.pipeline.index.store.context_cache import PostgresContextCache
from shardfuse.pipeline.index.store.inspection import chunk_quality
from shardfuse.pipeline.index.store.vector_index import BuildSettings, build_index
from shardfuse.pipeline.index.store.zone_models import ActiveModels

PASSWORD = "s3cret-pw"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def dsn() -> str:
    return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{_closed_port()}/nothing?connect_timeout=2"


@pytest.fixture(scope="module")
def pool(dsn: str) -> Iterator[ConnectionPool[Any]]:
    unreachable: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, timeout=0.3, open=False)
    unreachable.open(wait=False)
    yield unreachable
    unreachable.close()


CALLS: dict[str, Callable[[ConnectionPool[Any]], Any]] = {
    "shard store write path": lambda p: ShardStore(p, 3, dimensions=8).document_seq("z", "a.md"),
    "shard store read path": lambda p: ShardStore(p, 3, dimensions=8).fetch_chunks(["c1"], zone="z"),
    "shard store status": lambda p: ShardStore(p, 3, dimensions=8).zone_counts(),
    "inspection": lambda p: chunk_quality(ShardStore(p, 3, dimensions=8)),
    "dead-letter count": dead_letter_count,
    "dead-letter record": lambda p: record_dead_letter(p, task="t", payload={}, error_class="E", reason="r",
                                                       attempts=1),
    "embedding cache": lambda p: EmbeddingCache(p, provider="p", model="m", dimensions=8).get_many(["h"]),
    "context cache": lambda p: PostgresContextCache(p).get_many([("h", "d")], model="m", prompt_version="1"),
    "zone models": lambda p: ActiveModels(p, ttl_s=0).model("z"),
}


@pytest.mark.parametrize("adapter", sorted(CALLS))
def test_an_unreachable_database_is_store_unavailable_naming_where(adapter: str, pool: ConnectionPool[Any],
                                                                   dsn: str) -> None:
    with pytest.raises(StoreUnavailableError, match="database unavailable") as caught:
        CALLS[adapter](pool)
    assert postgres_location(dsn) in str(caught.value)
    assert PASSWORD not in str(caught.value)
    assert isinstance(caught.value.__cause__, psycopg.Error)


def test_opening_a_pool_or_building_an_index_on_an_unreachable_database(dsn: str) -> None:
    for action in (lambda: open_pool(dsn, timeout=1), lambda: build_index(dsn, "shard_0", BuildSettings())):
        with pytest.raises(StoreUnavailableError) as caught:
            action()
        assert postgres_location(dsn) in str(caught.value) and PASSWORD not in str(caught.value)
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)


def test_locations_name_host_port_and_database_only() -> None:
    assert postgres_location(f"postgresql://u:{PASSWORD}@db.internal:5433/shards") == "db.internal:5433/shards"
    assert postgres_location(f"host=10.1.2.3 dbname=x user=u password={PASSWORD}") == "10.1.2.3:5432/x"
    assert postgres_location("not a = dsn = at all") == "<unparseable connection string>"


@pytest.mark.parametrize(
    ("error", "family"),
    [
        (errors.AdminShutdown("terminating connection due to administrator command"), StoreUnavailableError),
        (errors.CannotConnectNow("the database system is starting up"), StoreUnavailableError),
        (errors.TooManyConnections("too many clients"), StoreUnavailableError),
        (psycopg.OperationalError("connection failed: Connection refused"), StoreUnavailableError),
        (errors.UndefinedTable('relation "shard_0.documents" does not exist'), SchemaMissingError),
        (errors.InvalidSchemaName('schema "shard_0" does not exist'), SchemaMissingError),
        (errors.QueryCanceled("canceling statement due to statement timeout"), TransientError),
        (errors.DeadlockDetected("deadlock detected"), TransientError),
        (errors.UniqueViolation("duplicate key"), TransientError),
    ],
)
def test_each_psycopg_error_has_its_family(error: psycopg.Error, family: type[Exception]) -> None:
    ours = translated(error, what="shard 0", where="h:5432/db")
    assert type(ours) is family
    assert "shard 0" in str(ours) and "h:5432/db" in str(ours) and str(error) in str(ours)


class _MissingTableConnection:
    """A pooled connection on a database without the ``zone_models`` table (no zone was ever reindexed)."""

    autocommit = False
    pgconn = SimpleNamespace(transaction_status=pq.TransactionStatus.IDLE)

    def execute(self, query: str, *args: Any) -> Any:
        raise errors.UndefinedTable('relation "shardfuse.zone_models" does not exist')


class _MissingTablePool:
    conninfo = "host=127.0.0.1 port=5432 dbname=x"

    @contextmanager
    def connection(self) -> Iterator[_MissingTableConnection]:
        yield _MissingTableConnection()


def test_a_missing_zone_models_table_means_the_default_model_everywhere() -> None:
    assert ActiveModels(_MissingTablePool(), ttl_s=0).model("z") == DEFAULT_MODEL  # type: ignore[arg-type]
