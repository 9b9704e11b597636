-- Run once by the postgres image when it creates its data directory (docker-compose.yml mounts this file in
-- /docker-entrypoint-initdb.d/), in POSTGRES_DB as POSTGRES_USER.
--
-- shardfuse creates the extension itself on first use (pipeline/index/store/connections.py), but the worker
-- containers start together, and concurrent CREATE EXTENSION IF NOT EXISTS can still fail with a unique
-- violation in pg_extension; made here, before the server reports healthy, there is nothing to race for.
CREATE EXTENSION IF NOT EXISTS vector;
