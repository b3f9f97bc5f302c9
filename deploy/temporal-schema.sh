#!/bin/sh
# Install or upgrade Temporal's PostgreSQL schemas (run by the temporal-schema service
# of docker-compose.yml, in temporalio/admin-tools, before the server starts).
# The databases exist already (postgres-init.sql). setup-schema -v 0.0 only creates
# the version table when it is missing, and update-schema applies the versions not yet
# applied, so this is safe on every start and upgrades the schema after an image bump.
set -eu
for db in temporal visibility; do
  name=$db
  [ "$db" = visibility ] && name=temporal_visibility
  temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p 5432 -u "$POSTGRES_USER" --db "$name" \
    setup-schema -v 0.0
  temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p 5432 -u "$POSTGRES_USER" --db "$name" \
    update-schema -d "/etc/temporal/schema/postgresql/v12/$db/versioned"
done
echo "temporal schemas are up to date"
