#!/usr/bin/env bash
# Builds the documentation site: regenerates the generated pages (the RLJob, algorithm and metrics
# references and the benchmark table, from the code and bench/results), then `mkdocs build --strict`
# (a broken link, anchor or missing page fails) into OUT_DIR (default site/, git-ignored).
# Usage: scripts/docs.sh [OUT_DIR]    Needs .venv (make setup installs mkdocs-material, the docs extra).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${KUBERL_VENV:-$repo/.venv}
out=${1:-$repo/site}

"$venv/bin/python" -m kuberl.operator.codegen.docgen "$repo/docs"
# Material's notice about MkDocs 2 is not about this site.
NO_MKDOCS_2_WARNING=1 "$venv/bin/python" -m mkdocs build --strict --quiet -f "$repo/mkdocs.yml" -d "$out"
echo "[docs] built $out/index.html" >&2
