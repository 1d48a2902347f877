#!/usr/bin/env bash
# Builds the container runtime and cluster DNS of the real-node tests (containerd, its runc shim and
# ctr; runc; CoreDNS) from the Go module proxy and caches them outside the repository, keyed by their
# versions. The kubelet and kube-proxy come from scripts/kube-binaries.sh (same Kubernetes module as
# the control plane); the CNI plugins and iptables are Debian's (scripts/node-deps.sh).
#
# runc is built rather than taken from Debian: Debian 12's runc 1.1.5 fails every pod sandbox that
# containerd 2.4 asks for here ("can't get final child's PID from pipe: EOF"); containerd 2.4 is
# tested against runc 1.4+.
# Prints the bin directory on stdout; logs go to stderr.
set -euo pipefail

CONTAINERD_VERSION=v2.4.2
COREDNS_VERSION=v1.14.7
RUNC_VERSION=v1.5.3

key="containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}_coredns-${COREDNS_VERSION}"
root=${KUBERL_CACHE:-$HOME/.cache/kuberl}/node/$key
bin=$root/bin
binaries=(containerd containerd-shim-runc-v2 ctr runc coredns)

log() { printf '[node-binaries] %s\n' "$*" >&2; }

missing=()
for name in "${binaries[@]}"; do [ -x "$bin/$name" ] || missing+=("$name"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { log "error: go is not installed; it is needed to build ${missing[*]}"; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$bin" "$root/src"
started=$(date +%s)

# build NAME MODULE@VERSION PACKAGE [TAGS]: go build PACKAGE inside an empty wrapper module.
build() {
  [ -x "$bin/$1" ] && return 0
  local dir=$root/src/$1
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  printf 'module kuberl.dev/node-binaries/%s\n\ngo 1.26.0\n' "$1" >go.mod
  log "building $1 from $2"
  go get "$2" >&2
  go build -trimpath -tags "${4:-}" -ldflags "-s -w" -o "$bin/$1" "$3"
}

# Static builds without cgo: btrfs and devmapper snapshotters need C headers and are not used
# (the node uses overlayfs).
tags="no_btrfs no_devmapper no_zfs no_aufs"
build containerd "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/containerd "$tags"
build containerd-shim-runc-v2 "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$tags"
build ctr "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/ctr "$tags"
build coredns "github.com/coredns/coredns@$COREDNS_VERSION" github.com/coredns/coredns
# runc needs cgo (its nsexec is C) and libseccomp for the pods' RuntimeDefault seccomp profile.
CGO_ENABLED=1 build runc "github.com/opencontainers/runc@$RUNC_VERSION" github.com/opencontainers/runc seccomp

log "built ${missing[*]} in $(( $(date +%s) - started )) s into $bin"
echo "$bin"
