#!/usr/bin/env bash
# Pushes the operator and trainer images that scripts/images.sh builds to a registry:
#   REGISTRY/kuberl-operator:VERSION and REGISTRY/kuberl-trainer:VERSION-cpu, and with PUSH_GPU=1 (make push
#   GPU=1) the GPU trainer REGISTRY/kuberl-trainer:VERSION too (about 10 GB: only for GPU nodes)
# and prints those references, the values the chart's image.repository and trainerImage take.
# Log in first if the registry needs it (`buildah login REGISTRY`, or podman's or docker's login:
# buildah reads the same auth file). Settings:
#   PUSH_TLS_VERIFY=false   a registry served over plain HTTP (a test's or a lab's)
#   PUSH_COMPRESS=0         push layers uncompressed: no CPU spent compressing, same layer digests as
#                           the local image (a node that imported the image archive pulls nothing)
set -euo pipefail

registry=${1:-}
[ -n "$registry" ] || { echo "usage: scripts/push-images.sh REGISTRY   (e.g. registry.example.com/my-team; make push REGISTRY=...)" >&2; exit 2; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KUBERL_CACHE:-$HOME/.cache/kuberl}/images
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)
[ -n "$version" ] || { echo "push-images: no version in pyproject.toml" >&2; exit 1; }

built=$(bash "$repo/scripts/images.sh")
local_ref() { sed -n "s/^$1_IMAGE=//p" <<<"$built"; }
flags=(--tls-verify="${PUSH_TLS_VERIFY:-true}")
[ "${PUSH_COMPRESS:-1}" = 0 ] && flags+=(--disable-compression)

push() {  # push LOCAL-REF REMOTE-REF
  echo "[push] $1 -> $2" >&2
  buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver overlay push --quiet "${flags[@]}" "$1" "docker://$2" >&2
}
operator_ref=$registry/kuberl-operator:$version
trainer_ref=$registry/kuberl-trainer:$version-cpu
push "$(local_ref OPERATOR)" "$operator_ref"
push "$(local_ref TRAINER)" "$trainer_ref"
printf 'OPERATOR_IMAGE=%s\nTRAINER_IMAGE=%s\n' "$operator_ref" "$trainer_ref"
if [ "${PUSH_GPU:-0}" = 1 ]; then
  [ -n "$(local_ref GPU_TRAINER)" ] || { echo "push-images: PUSH_GPU=1, but images.sh built no GPU trainer (KUBERL_GPU_IMAGE=0?)" >&2; exit 1; }
  gpu_ref=$registry/kuberl-trainer:$version
  push "$(local_ref GPU_TRAINER)" "$gpu_ref"
  printf 'GPU_TRAINER_IMAGE=%s\n' "$gpu_ref"
fi
echo "[push] install the chart with: --set image.repository=$registry/kuberl-operator --set trainerImage=$trainer_ref" >&2
