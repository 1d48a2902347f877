#!/usr/bin/env bash
# Builds the batch schedulers that the scheduling tests run against the test control plane: the Kueue
# manager (sigs.k8s.io/kueue/cmd/kueue) and the JobSet controller manager (sigs.k8s.io/jobset, whose
# main package is the module root), from the Go module proxy, and caches them outside the repository,
# keyed by their versions. Next to bin/ it unpacks what the managers need on a cluster from the same
# module zips: their CRDs (crds/kueue/*.yaml, crds/jobset/*.yaml) and their webhook configurations
# (webhooks/kueue.yaml, webhooks/jobset.yaml: service references, which
# kuberl.operator.testing.scheduling rewrites to loopback URLs) and the CRD patches that turn on
# Kueue's conversion webhook (conversion/kueue/*.yaml).
#
# Neither module has `replace` directives, so a plain `go get` in a wrapper module works (unlike
# k8s.io/kubernetes). Both build with the local Go (kueue asks for go 1.25, jobset for go 1.26).
# Prints the bin directory on stdout; logs go to stderr.
set -euo pipefail

KUEUE_VERSION=v0.17.0
JOBSET_VERSION=v0.12.0 # the proxy lists no jobset versions: ask for this exact one

key="kueue-${KUEUE_VERSION}_jobset-${JOBSET_VERSION}"
script=scheduling-binaries
root=${KUBERL_CACHE:-$HOME/.cache/kuberl}/scheduling/$key
binaries=(kueue jobset-manager)

# The manifests first: go-binaries.sh exits as soon as every binary is cached.
manifests() {
  [ -f "$root/manifests.done" ] && return 0
  command -v go >/dev/null || { printf '[%s] error: go is not installed\n' "$script" >&2; exit 1; }
  local kueue jobset
  kueue=$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  jobset=$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/jobset@$JOBSET_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$kueue/config/components/crd/bases" ] && [ -d "$jobset/config/components/crd/bases" ] \
    || { printf '[%s] error: no CRDs in %s or %s\n' "$script" "$kueue" "$jobset" >&2; exit 1; }
  rm -rf "$root/crds" "$root/webhooks" "$root/conversion"
  mkdir -p "$root/crds/kueue" "$root/crds/jobset" "$root/webhooks" "$root/conversion/kueue"
  cp "$kueue"/config/components/crd/bases/*.yaml "$root/crds/kueue/"
  # The CRDs whose conversion webhook Kueue's kustomization turns on (its uncommented patches).
  local patch
  for patch in $(sed -n 's#^- path: \(patches/webhook_in_.*\.yaml\)$#\1#p' "$kueue/config/components/crd/kustomization.yaml"); do
    cp "$kueue/config/components/crd/$patch" "$root/conversion/kueue/"
  done
  [ -n "$(ls "$root/conversion/kueue")" ] || { printf '[%s] error: no conversion patches in %s\n' "$script" "$kueue" >&2; exit 1; }
  cp "$jobset"/config/components/crd/bases/*.yaml "$root/crds/jobset/"
  cp "$kueue/config/components/webhook/manifests.yaml" "$root/webhooks/kueue.yaml"
  cp "$jobset/config/components/webhook/manifests.yaml" "$root/webhooks/jobset.yaml"
  chmod -R u+w "$root/crds" "$root/webhooks" "$root/conversion" # the module cache is read-only
  touch "$root/manifests.done"
}
mkdir -p "$root"
manifests

# shellcheck source=go-binaries.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-binaries.sh"

# build_manager NAME MODULE VERSION PACKAGE: like build_one, with the module's version stamped in.
build_manager() {
  [ -x "$bin/$1" ] && return 0
  wrapper "$1"
  log "building $1 from $2@$3 (several minutes on 2 cores)"
  go get "$2@$3" >&2
  local t0=$SECONDS
  go build -trimpath -ldflags "-s -w -X $2/pkg/version.GitVersion=$3" -o "$bin/$1" "$4"
  log "built $1 in $(( SECONDS - t0 )) s"
}

build_manager kueue sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue
build_manager jobset-manager sigs.k8s.io/jobset "$JOBSET_VERSION" sigs.k8s.io/jobset

finish
