#!/usr/bin/env bash
# Debian's packages the real-node tests need: the CNI plugins, iptables (kube-proxy, the CNI bridge's
# masquerade), buildah and mmdebstrap (the images), iproute2 and util-linux (network namespaces,
# nsenter), what node-binaries.sh and kube-binaries.sh compile C with (gcc, libc6-dev for the
# static pause, libseccomp-dev and pkg-config for runc), and chromium, the headless browser that
# tests/test_docs.py opens the built docs site in, and bubblewrap with libseccomp2, the kernel
# boundary of the sandboxed tools (python and functions of a file), and ipset, which kube-router's firewall
# (the NetworkPolicy enforcer of the real-node test on kernels without nftables' queue) calls. Installs only
# what is missing; needs root, as CI has.
set -euo pipefail

packages=(containernetworking-plugins iptables buildah mmdebstrap iproute2 util-linux gcc libc6-dev libseccomp-dev pkg-config chromium bubblewrap libseccomp2 ipset)
log() { printf '[node-deps] %s\n' "$*" >&2; }

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  log "error: missing Debian packages ${missing[*]}; install them as root (apt-get install ${missing[*]})"
  exit 1
fi
log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
