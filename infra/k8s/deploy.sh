#!/usr/bin/env bash
# Roll out one release (an image tag already pushed to both ECR repositories) to one
# environment: shared resources, then the migration Job, and api, worker and the launcher only
# once it has succeeded. Needs terraform (state access), kubectl (cluster access) and the
# loraplex package.
#   infra/k8s/deploy.sh dev v1.2.0
set -euo pipefail

env=${1:?usage: deploy.sh ENV TAG}
tag=${2:?usage: deploy.sh ENV TAG}
here=$(cd "$(dirname "$0")" && pwd)
outputs=$(mktemp)
trap 'rm -f "$outputs"' EXIT

terraform -chdir="$here/../terraform/envs/$env" output -json >"$outputs"
# The engine image is tagged by its content (infra/k8s/engine_tag.py): unchanged engines are
# not rolled by a release that does not touch them.
engine_tag=${ENGINE_TAG:-$(python -m loraplex.infra.k8s.engine_tag)}
render() { python -m loraplex.infra.k8s.render --env "$env" --outputs "$outputs" --tag "$tag" --engine-tag "$engine_tag" "$@"; }
ns=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["namespace"]["value"])' "$outputs")
release=$(render release-name)

render platform --phase pre-rollout | kubectl apply -f -
echo "waiting for the migration Job of $release"
kubectl -n "$ns" wait --for=condition=complete --timeout=900s "job/loraplex-migrate-$release"
render platform --phase rollout | kubectl apply -f -
kubectl -n "$ns" rollout status deployment/loraplex-api --timeout=600s
kubectl -n "$ns" rollout status deployment/loraplex-worker --timeout=600s
kubectl -n "$ns" rollout status deployment/loraplex-launcher --timeout=600s
echo "release $release is live in $env"
