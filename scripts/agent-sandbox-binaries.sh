#!/usr/bin/env bash
# Builds the kubernetes-sigs agent-sandbox controller (sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller)
# that the cluster tier runs against the test control plane for a job whose sandbox backend is agentSandbox,
# from the Go module proxy (no container registry, no GitHub), and caches it outside the repository, keyed by
# its version. Next to bin/ it unpacks the module's CRDs (crds/*.yaml: Sandbox in agents.x-k8s.io; SandboxClaim,
# SandboxTemplate and SandboxWarmPool in extensions.agents.x-k8s.io), from k8s/crds of the same module zip.
#
# Run the controller with --extensions (its SandboxTemplate, SandboxClaim and SandboxWarmPool controllers; off
# by default) and --leader-elect=false outside a cluster. The module has no `replace` directives, so a plain
# `go get` in a wrapper module works; it asks for go 1.26.0, which the local Go satisfies.
# Prints the bin directory on stdout; logs go to stderr.
set -euo pipefail

AGENT_SANDBOX_VERSION=v1.0.1

script=agent-sandbox-binaries
root=${KUBERL_CACHE:-$HOME/.cache/kuberl}/agent-sandbox/$AGENT_SANDBOX_VERSION
binaries=(agent-sandbox-controller)

# The CRDs first: go-binaries.sh exits as soon as every binary is cached.
manifests() {
  [ -f "$root/manifests.done" ] && return 0
  command -v go >/dev/null || { printf '[%s] error: go is not installed\n' "$script" >&2; exit 1; }
  local module
  module=$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -f "$module/k8s/crds/extensions.agents.x-k8s.io_sandboxwarmpools.yaml" ] \
    || { printf '[%s] error: no CRDs in %s/k8s/crds\n' "$script" "$module" >&2; exit 1; }
  rm -rf "$root/crds"
  mkdir -p "$root/crds"
  cp "$module"/k8s/crds/*.yaml "$root/crds/"
  chmod -R u+w "$root/crds" # the module cache is read-only
  touch "$root/manifests.done"
}
mkdir -p "$root"
manifests

# shellcheck source=go-binaries.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-binaries.sh"

if [ ! -x "$bin/agent-sandbox-controller" ]; then
  module=sigs.k8s.io/agent-sandbox
  wrapper agent-sandbox-controller
  log "building agent-sandbox-controller from $module@$AGENT_SANDBOX_VERSION (minutes on 2 cores)"
  go get "$module@$AGENT_SANDBOX_VERSION" >&2
  t0=$SECONDS
  go build -trimpath -ldflags "-s -w -X $module/internal/version.gitVersion=$AGENT_SANDBOX_VERSION" \
    -o "$bin/agent-sandbox-controller" "$module/cmd/agent-sandbox-controller"
  log "built agent-sandbox-controller in $(( SECONDS - t0 )) s"
fi

finish
