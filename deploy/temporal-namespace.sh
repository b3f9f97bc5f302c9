#!/bin/sh
# Create the namespace the workers use, once (run by the temporal-namespace service of
# docker-compose.yml, in temporalio/admin-tools, after the server is healthy).
set -eu
ns=${DEFAULT_NAMESPACE:-default}
until temporal operator cluster health --address "$TEMPORAL_ADDRESS"; do sleep 2; done
temporal operator namespace describe -n "$ns" --address "$TEMPORAL_ADDRESS" >/dev/null 2>&1 \
  || temporal operator namespace create -n "$ns" --retention 72h --address "$TEMPORAL_ADDRESS"
echo "namespace $ns is ready"
