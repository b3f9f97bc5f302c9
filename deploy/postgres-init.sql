-- Run store database for the Durable Agents workers (docker-compose.yml).
--
-- Executed once by the postgres image's entrypoint, as the superuser, when the data
-- volume is empty (files in /docker-entrypoint-initdb.d). To re-run it on an existing
-- stack: `docker compose -f deploy/docker-compose.yml down -v` (deletes all data).
--
-- Temporal's own databases (temporal, temporal_visibility) are created by the
-- temporalio/auto-setup container, not here.
--
-- The workers use this database once the PostgreSQL run store has landed (the
-- recovery issue): AGENT_STORE_URL=postgresql://agent:agent@postgresql:5432/agent_store
-- Until then they use SQLite on the agent-state volume and this database stays empty.
--
-- The password is for the local compose stack only.

CREATE ROLE agent WITH LOGIN PASSWORD 'agent';
CREATE DATABASE agent_store OWNER agent;
REVOKE ALL ON DATABASE agent_store FROM PUBLIC;
GRANT ALL PRIVILEGES ON DATABASE agent_store TO agent;
