#!/usr/bin/env bash
# `make deploy-check`: validate the deploy files offline (no Docker engine, no cluster).
#   - k8s/*.yaml against the Kubernetes JSON schemas bundled in kubernetes-validate
#     (strict: unknown fields fail), and the kustomize output when kubectl is present;
#   - docker-compose.yml against the compose-spec JSON schema vendored in check-jsonschema;
#   - the shell scripts the compose stack mounts (sh -n: syntax only).
# BIN: the directory holding kubernetes-validate and check-jsonschema (the venv's bin).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${BIN:-$here/../.venv/bin}
manifests=()
for f in "$here"/k8s/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
"$bin/kubernetes-validate" --strict --quiet "${manifests[@]}"
if command -v kubectl >/dev/null; then
  rendered=$(mktemp --suffix=.yaml)
  trap 'rm -f "$rendered"' EXIT
  kubectl kustomize "$here/k8s" >"$rendered"
  "$bin/kubernetes-validate" --strict --quiet "$rendered"
  echo "kustomize output: valid"
else
  echo "kubectl not found: kustomization.yaml not rendered (each manifest was still validated)"
fi
echo "k8s manifests: valid (${#manifests[@]} files)"
"$bin/check-jsonschema" --builtin-schema vendor.compose-spec "$here/docker-compose.yml"
for script in "$here"/temporal-*.sh; do sh -n "$script"; done
echo "compose scripts: syntax ok"
