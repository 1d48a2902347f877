#!/usr/bin/env bash
# Vendors JobSet's own Helm chart into helm/kuberl/charts/jobset, the subchart that `jobset.install=true`
# installs. The chart comes from the Go module zip of sigs.k8s.io/jobset at the version the tests build
# (scripts/scheduling-binaries.sh), and is made what JobSet's release publishes
# (oci://registry.k8s.io/jobset/charts/jobset, made by the module's hack/helm-chart-package.sh): the
# released image (registry.k8s.io/jobset/jobset, tagged with the version, pullPolicy IfNotPresent) and
# appVersion set to the version; the files that the chart's .helmignore leaves out of a package (its
# helm-unittest tests and the helm-docs template) left out here too. The module's LICENSE (Apache-2.0)
# goes with it; every file keeps its license header.
#
# Usage: scripts/vendor-jobset-chart.sh [DEST]   (default helm/kuberl/charts/jobset; DEST is replaced)
# tests/test_jobset_chart.py checks that the vendored copy is what this script makes.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$repo/helm/kuberl/charts/jobset}
version=$(sed -n 's/^JOBSET_VERSION=\(v[0-9.]*\).*/\1/p' "$repo/scripts/scheduling-binaries.sh")
script=vendor-jobset-chart

die() { printf '[%s] error: %s\n' "$script" "$*" >&2; exit 1; }

[ -n "$version" ] || die "no JOBSET_VERSION in scripts/scheduling-binaries.sh"
command -v go >/dev/null || die "go is not installed"
module=$(cd "$repo" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/jobset@$version" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
chart=$module/charts/jobset
[ -f "$chart/Chart.yaml" ] || die "no Helm chart (charts/jobset) in sigs.k8s.io/jobset@$version ($module)"
[ -f "$module/LICENSE" ] || die "no LICENSE in $module"
chart_version=$(sed -n 's/^version:[[:space:]]*\([^[:space:]]*\)$/\1/p' "$chart/Chart.yaml")
[ "$chart_version" = "${version#v}" ] || die "the module's chart has version '$chart_version', not ${version#v}"
! grep -q '^appVersion:' "$chart/Chart.yaml" || die "the module's chart sets an appVersion: check what its release changes"

rm -rf "$dest"
mkdir -p "$dest"
cp -R "$chart/." "$dest/"
chmod -R u+w "$dest" # the module cache is read-only
rm -rf "$dest/tests" "$dest/README.md.gotmpl"
cp "$module/LICENSE" "$dest/LICENSE"
chmod 644 "$dest/LICENSE"

# What hack/helm-chart-package.sh sets for a release (with yq there; each line must match once here).
release_value() {  # PATTERN REPLACEMENT: one line of values.yaml's image block
  [ "$(grep -c "^  $1\$" "$dest/values.yaml")" = 1 ] || die "values.yaml has not exactly one line '  $1'"
  sed -i "s#^  $1\$#  $2#" "$dest/values.yaml"
}
release_value 'repository: us-central1-docker.pkg.dev/k8s-staging-images/jobset/jobset' 'repository: registry.k8s.io/jobset/jobset'
release_value 'pullPolicy: Always' 'pullPolicy: IfNotPresent'
release_value 'tag: main' "tag: $version"
# `helm package --app-version` sets appVersion.
sed -i "s/^version: ${version#v}\$/&\nappVersion: $version/" "$dest/Chart.yaml"
grep -q "^appVersion: $version\$" "$dest/Chart.yaml" || die "could not set appVersion in Chart.yaml"
printf '[%s] vendored JobSet %s chart into %s\n' "$script" "$version" "$dest" >&2
