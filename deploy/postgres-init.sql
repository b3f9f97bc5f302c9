-- Databases of the compose stack (docker-compose.yml).
--
-- Executed once by the postgres image's entrypoint, as the superuser, when the data
-- volume is empty (files in /docker-entrypoint-initdb.d). To re-run it on an existing
-- stack: `docker compose -f deploy/docker-compose.yml down -v` (deletes all data).
--
-- temporal_visibility: Temporal's visibility database. Its persistence database,
-- temporal, is the image's own default database (POSTGRES_USER=temporal creates it).
-- Both schemas are installed and upgraded by the temporal-schema service
-- (temporal-schema.sh) on every start.
--
-- agent_store: the workers' PostgreSQL run store (idempotency ledger, transcripts),
-- AGENT_STORE_URL in deploy/agent.env. The password is for the local stack only.

CREATE DATABASE temporal_visibility OWNER temporal;

CREATE ROLE agent WITH LOGIN PASSWORD 'agent';
CREATE DATABASE agent_store OWNER agent;
REVOKE ALL ON DATABASE agent_store FROM PUBLIC;
GRANT ALL PRIVILEGES ON DATABASE agent_store TO agent;
