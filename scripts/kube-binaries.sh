#!/usr/bin/env bash
# Builds the Kubernetes binaries the cluster tests run (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kubelet, kube-proxy, the pause binary of the node's sandbox image, etcd,
# kwok, helm) from the Go module proxy, and caches them outside the
# repository, keyed by their versions. Prints the bin directory on stdout; logs go to stderr.
#
# No Docker, no release downloads: only `go` and the module proxy. k8s.io/kubernetes is not meant to
# be a dependency (its go.mod points its staging modules at ./staging), so each binary is built in a
# small wrapper module that replaces every staging module k8s.io/<name> with its v0.N.x release.
set -euo pipefail

K8S_VERSION=v1.37.2
STAGING_VERSION=v0.37.2 # the staging modules released with K8S_VERSION
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0

key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
script=kube-binaries
root=${KUBERL_CACHE:-$HOME/.cache/kuberl}/kube/$key
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy pause etcd kwok helm)
# shellcheck source=go-binaries.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-binaries.sh"

build_kubernetes() {
  wrapper kubernetes
  log "fetching k8s.io/kubernetes $K8S_VERSION"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  local staging
  staging=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod")
  [ -n "$staging" ] || { log "error: no staging modules found in $gomod"; exit 1; }
  local args=()
  for module in $staging; do args+=("-replace=$module=$module@$STAGING_VERSION"); done
  go mod edit "${args[@]}"
  go get "k8s.io/kubernetes@$K8S_VERSION" >&2
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  for name in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    [ -x "$bin/$name" ] && continue
    log "building $name (a few minutes each on 2 cores)"
    go build -trimpath -ldflags "$ldflags" -o "$bin/$name" "k8s.io/kubernetes/cmd/$name"
  done
}

# The pods' sandbox process: Kubernetes' own build/pause/linux/pause.c, static (gcc, libc6-dev).
build_pause() {
  [ -x "$bin/pause" ] && return 0
  command -v gcc >/dev/null || { log "error: gcc is not installed; it is needed to build pause (scripts/node-deps.sh)"; exit 1; }
  local dir
  dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  local tag
  tag=$(sed -n 's/^TAG ?= //p' "$dir/build/pause/Makefile")
  log "building pause $tag from $dir/build/pause/linux/pause.c"
  gcc -Os -Wall -static -DVERSION="v$tag" -o "$bin/pause" "$dir/build/pause/linux/pause.c"
}

build_kubernetes
build_pause
build_one etcd "go.etcd.io/etcd/server/v3@$ETCD_VERSION" go.etcd.io/etcd/server/v3
build_one kwok "sigs.k8s.io/kwok@$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
build_one helm "helm.sh/helm/v3@$HELM_VERSION" helm.sh/helm/v3/cmd/helm

finish
