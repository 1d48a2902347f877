#!/usr/bin/env bash
# Makes kuberl's release artifacts in one folder (default dist/):
#   kuberl-V-py3-none-any.whl, kuberl-V.tar.gz   the Python package (uv build; setuptools)
#   kuberl-V.tgz                                 the Helm chart (helm package helm/kuberl)
#   kuberl-operator-V.tar, kuberl-trainer-V-cpu.tar
#                                                the images as docker-archives
#   SHA256SUMS                                   over all of them: `sha256sum -c SHA256SUMS` in the folder
# V is pyproject.toml's version, which must equal the chart's version and appVersion.
#
# Usage: scripts/dist.sh [OUT_DIR]
#   BUILDER=docker|podman|buildah
#                  build the images with it from the Dockerfiles, on DIST_BASE_IMAGE (default the official
#                  python:3.11-slim), and save them as docker-archives; BUILDER_FLAGS go before its
#                  subcommand (e.g. buildah's --root), BUILD_FLAGS after `build` (e.g. a proxy's CA:
#                  --volume /etc/ca.crt:/tmp/ca.crt:ro --build-arg PIP_CERT=/tmp/ca.crt with podman or
#                  buildah). Without BUILDER: scripts/images.sh, the tests'
#                  builder (buildah and mmdebstrap, root; cached by a hash of the inputs, hardlinked here)
#   DIST_IMAGES=0  leave the image archives out; DIST_IMAGES=operator: the operator's only
#   DIST_PYTHON=0  leave the wheel and sdist out (the chart's install test needs only the chart)
#   HELM, UV       the helm and uv to use (default: the ones on PATH, else the tests' own builds)
# OUT_DIR may hold only what an earlier run made there; that is replaced. Prints what it made on
# stdout; logs go to stderr.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$repo/dist}
cache=${KUBERL_CACHE:-$HOME/.cache/kuberl}
uv=${UV:-$(command -v uv || echo "$cache/tools/uv-0.13.8/bin/uv")}  # else the version scripts/setup.sh installs
python=${KUBERL_PYTHON:-python3.11}
with_images=${DIST_IMAGES:-1}
with_python=${DIST_PYTHON:-1}

log() { printf '[dist] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- one version everywhere, checked before anything is built -----------------------------------
command -v "$python" >/dev/null || die "$python not found; set KUBERL_PYTHON to a Python 3.11 interpreter"
version=$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml")
chart_field() {  # the value of a top-level key of Chart.yaml, without quotes
  sed -n "s/^$1:[[:space:]]*[\"']\{0,1\}\([^\"'[:space:]]*\)[\"']\{0,1\}[[:space:]]*\$/\1/p" "$repo/helm/kuberl/Chart.yaml"
}
chart_version=$(chart_field version)
app_version=$(chart_field appVersion)
if [ "$chart_version" != "$version" ] || [ "$app_version" != "$version" ]; then
  die "versions disagree: pyproject.toml has version '$version', helm/kuberl/Chart.yaml has version '$chart_version' and appVersion '$app_version'; make all three equal"
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
shopt -s nullglob dotglob
for f in "$out"/*; do
  case ${f##*/} in
    kuberl-*|SHA256SUMS) ;;
    *) die "$out holds ${f##*/}, which dist.sh does not make; give an empty folder or one an earlier run made" ;;
  esac
done
shopt -u dotglob

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/new"

# --- the Python package -------------------------------------------------------------------------
if [ "$with_python" != 0 ]; then
  [ -x "$uv" ] || die "uv not found at $uv; run scripts/setup.sh (it installs uv there) or set UV"
  git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 || die "$repo is not a git checkout (dist.sh builds the files git tracks or would track)"
  # Built from a copy of the files git tracks or would track, not in place: in the repository
  # setuptools would reuse build/ and kuberl.egg-info/ (a stale build/lib can put deleted modules in
  # the wheel, a stale SOURCES.txt old files in the sdist), and write them while others build.
  # Tracked files deleted in the work tree are left out.
  mkdir -p "$work/src"
  git -C "$repo" ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do if [ -e "$repo/$f" ] || [ -L "$repo/$f" ]; then printf '%s\0' "$f"; fi; done \
    | tar -C "$repo" --null -T - -cf - | tar -C "$work/src" -xf -
  # The zip entries' times of the wheel come from here: the same tree makes the same wheel.
  export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}
  # The lock pins the build backend (setuptools) too, as it pins everything else.
  build=("$uv" build --quiet --build-constraint "$repo/requirements/cpu.lock")
  log "building the wheel and the sdist of kuberl $version"
  (cd "$work/src" && timeout 600 "${build[@]}" --sdist --wheel --out-dir "$work/python")
  wheel=kuberl-$version-py3-none-any.whl sdist=kuberl-$version.tar.gz
  [ -f "$work/python/$wheel" ] && [ -f "$work/python/$sdist" ] || die "uv build made $(ls "$work/python"), not $wheel and $sdist"
  # What a user's pip does with the sdist: build a wheel from it. It must be the wheel built from
  # the tree, file for file and byte for byte (RECORD lists every file with its hash); a difference
  # means the sdist lacks a file the build needs.
  timeout 600 "${build[@]}" --wheel --out-dir "$work/from-sdist" "$work/python/$sdist"
  record() {
    "$python" -c 'import sys, zipfile; print(*sorted(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]).decode().splitlines()), sep="\n")' \
      "$1" "kuberl-$version.dist-info/RECORD"
  }
  if ! diff <(record "$work/python/$wheel") <(record "$work/from-sdist/$wheel") >&2; then
    die "the wheel built from the sdist differs from the one built from the tree (above: < tree, > sdist): the sdist lacks what the build needs (MANIFEST.in)"
  fi
  mv "$work/python/$wheel" "$work/python/$sdist" "$work/new/"
fi

# --- the Helm chart -----------------------------------------------------------------------------
helm=${HELM:-$(command -v helm || true)}
if [ -z "$helm" ]; then
  # No helm here: the tests' own, which kube-binaries.sh builds once from the Go module proxy (needs Go).
  helm=$(timeout 3600 bash "$repo/scripts/kube-binaries.sh" | tail -n 1)/helm
fi
log "packaging the Helm chart helm/kuberl"
HELM_CACHE_HOME=$work/helm HELM_CONFIG_HOME=$work/helm HELM_DATA_HOME=$work/helm \
  timeout 120 "$helm" package "$repo/helm/kuberl" --destination "$work/new" >/dev/null
[ -f "$work/new/kuberl-$version.tgz" ] || die "helm package made $(ls "$work/new"), not kuberl-$version.tgz"

# --- the images ---------------------------------------------------------------------------------
image_refs=() image_archives=()
names=("kuberl-operator-$version.tar" "kuberl-trainer-$version-cpu.tar")
case $with_images in
  0) names=() ;;
  operator) names=("${names[0]}") ;;
  1) ;;
  *) die "DIST_IMAGES is '$with_images': 1 (both images), operator (the operator's only) or 0 (none)" ;;
esac
builder=${BUILDER:-}
if [ "${#names[@]}" -gt 0 ] && [ -n "$builder" ]; then
  case $builder in
    docker|podman|buildah) ;;
    *) die "BUILDER is '$builder': docker, podman or buildah" ;;
  esac
  command -v "$builder" >/dev/null || die "BUILDER=$builder, but $builder is not on PATH"
  base=${DIST_BASE_IMAGE:-python:3.11-slim}
  read -r -a flags <<<"${BUILDER_FLAGS:-}"
  read -r -a build_flags <<<"${BUILD_FLAGS:-}"
  dockerfiles=(Dockerfile trainer_image/Dockerfile) args=("" "--build-arg VARIANT=cpu")
  refs=("kuberl-operator:$version" "kuberl-trainer:$version-cpu")
  for i in "${!names[@]}"; do
    log "building ${refs[$i]} with $builder from ${dockerfiles[$i]} on $base"
    # shellcheck disable=SC2086  # the VARIANT argument is two words or none
    timeout 7200 "$builder" "${flags[@]}" build "${build_flags[@]}" --build-arg "BASE_IMAGE=$base" ${args[$i]} \
      -f "$repo/${dockerfiles[$i]}" -t "${refs[$i]}" "$repo" >&2
    mkdir -p "$work/images"
    archive=$work/images/${names[$i]}
    case $builder in
      docker) docker "${flags[@]}" save -o "$archive" "${refs[$i]}" ;;
      podman) podman "${flags[@]}" save --format docker-archive -o "$archive" "${refs[$i]}" ;;
      buildah) buildah "${flags[@]}" push --quiet "${refs[$i]}" "docker-archive:$archive:${refs[$i]}" >&2 ;;
    esac
    image_refs+=("${refs[$i]}") image_archives+=("$archive")
  done
elif [ "${#names[@]}" -gt 0 ]; then
  log "images: scripts/images.sh (cached by a hash of their inputs; a first build takes tens of minutes)"
  built=$(KUBERL_GPU_IMAGE=0 timeout 7200 bash "$repo/scripts/images.sh")
  value() { sed -n "s/^$1=//p" <<<"$built"; }
  image_refs=("$(value OPERATOR_IMAGE)" "$(value TRAINER_IMAGE)")
  image_archives=("$(value OPERATOR_ARCHIVE)" "$(value TRAINER_ARCHIVE)")
  image_refs=("${image_refs[@]:0:${#names[@]}}") image_archives=("${image_archives[@]:0:${#names[@]}}")
  for src in "${image_archives[@]}"; do [ -f "$src" ] || die "scripts/images.sh named the archive '$src', which is not there"; done
fi
(cd "$work/new" && sha256sum kuberl-*) > "$work/sums"

# --- replace OUT_DIR's contents -----------------------------------------------------------------
rm -f "$out"/kuberl-* "$out/SHA256SUMS"
mv "$work/new"/* "$out/"
if [ "${#names[@]}" -gt 0 ]; then
  for i in "${!names[@]}"; do
    # Gigabytes each: a hardlink to the cached archive (images.sh never rewrites one in place, it
    # writes a new file and renames it), or a reflink copy where the cache is on another filesystem.
    if [[ ${image_archives[$i]} == "$work"/* ]]; then mv "${image_archives[$i]}" "$out/${names[$i]}"  # BUILDER's, made here
    else ln -f "${image_archives[$i]}" "$out/${names[$i]}" 2>/dev/null || cp --reflink=auto "${image_archives[$i]}" "$out/${names[$i]}"; fi
  done
  (cd "$out" && sha256sum "${names[@]}") >> "$work/sums"
fi
mv "$work/sums" "$out/SHA256SUMS"

echo "kuberl $version in $out:"
(cd "$out" && du -h -l --apparent-size kuberl-* SHA256SUMS | sed 's/^/  /')
for ref in "${image_refs[@]}"; do echo "  an image archive holds $ref"; done
