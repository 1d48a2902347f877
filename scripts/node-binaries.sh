#!/usr/bin/env bash
# Builds the container runtime and cluster DNS of the real-node tests (containerd, its runc shim and
# ctr; runc; CoreDNS) from the Go module proxy and caches them outside the repository, keyed by their
# versions; and a container registry (distribution's), which the quickstart test pushes the images to
# and the node pulls them from. The kubelet and kube-proxy come from scripts/kube-binaries.sh (same Kubernetes module as
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
REGISTRY_VERSION=v3.0.0

key="containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}_coredns-${COREDNS_VERSION}_registry-${REGISTRY_VERSION}"
script=node-binaries
root=${KUBERL_CACHE:-$HOME/.cache/kuberl}/node/$key
binaries=(containerd containerd-shim-runc-v2 ctr runc coredns registry)
# shellcheck source=go-binaries.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-binaries.sh"

# Static builds without cgo: btrfs and devmapper snapshotters need C headers and are not used
# (the node uses overlayfs).
tags="no_btrfs no_devmapper no_zfs no_aufs"
build_one containerd "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/containerd "$tags"
build_one containerd-shim-runc-v2 "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$tags"
build_one ctr "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/ctr "$tags"
build_one coredns "github.com/coredns/coredns@$COREDNS_VERSION" github.com/coredns/coredns
build_one registry "github.com/distribution/distribution/v3@$REGISTRY_VERSION" github.com/distribution/distribution/v3/cmd/registry
# runc needs cgo (its nsexec is C) and libseccomp for the pods' RuntimeDefault seccomp profile.
CGO_ENABLED=1 build_one runc "github.com/opencontainers/runc@$RUNC_VERSION" github.com/opencontainers/runc seccomp

finish
