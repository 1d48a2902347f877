#!/usr/bin/env bash
# Debian's prometheus package (server and promtool), unpacked once into a cache folder keyed by its
# version; nothing is installed system-wide and no service starts. Prints the folder with the binaries.
set -euo pipefail
cache="${KUBERL_CACHE:-$HOME/.cache/kuberl}/prometheus"
mkdir -p "$cache"
existing=$(ls -d "$cache"/*/usr/bin 2>/dev/null | head -n1 || true)
if [ -n "$existing" ] && [ -x "$existing/prometheus" ] && [ -x "$existing/promtool" ]; then
  echo "$existing"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download prometheus >/dev/null 2>&1; then
  # A fresh machine may not have the package lists yet.
  apt-get update >/dev/null 2>&1 || { echo "prometheus.sh: apt-get update failed (needs root and Debian's mirrors)" >&2; exit 1; }
  apt-get download prometheus >/dev/null 2>&1 || { echo "prometheus.sh: apt-get download prometheus failed" >&2; exit 1; }
fi
deb=$(ls prometheus_*.deb)
version=${deb#prometheus_}; version=${version%.deb}
dpkg-deb -x "$deb" "$cache/$version.partial"
mv "$cache/$version.partial" "$cache/$version"
echo "$cache/$version/usr/bin"
