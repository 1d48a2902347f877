# Sourced by kube-binaries.sh and node-binaries.sh: build Go commands from the Go module proxy into a
# cache folder keyed by their versions. The caller sets `script` (its own name, for logs and wrapper
# modules), `root` (the cache folder; binaries go to $root/bin) and `binaries` (what must be there).

bin=$root/bin
log() { printf '[%s] %s\n' "$script" "$*" >&2; }

# Prints the bin folder and exits when every binary is cached; otherwise prepares the build.
missing=()
for binary in "${binaries[@]}"; do [ -x "$bin/$binary" ] || missing+=("$binary"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { log "error: go is not installed; it is needed to build ${missing[*]}"; exit 1; }
# The local Go (1.26) builds every pinned module; never fetch another toolchain behind our back.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$bin" "$root/src"
started=$(date +%s)

# wrapper NAME: an empty module in $root/src/NAME to build from, and cd into it.
wrapper() {
  local dir=$root/src/$1
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  printf 'module kuberl.dev/%s/%s\n\ngo 1.26.0\n' "$script" "$1" >go.mod
}

# build_one NAME MODULE@VERSION PACKAGE [TAGS]: go build PACKAGE inside a wrapper module.
build_one() {
  [ -x "$bin/$1" ] && return 0
  wrapper "$1"
  log "building $1 from $2"
  go get "$2" >&2
  go build -trimpath -tags "${4:-}" -ldflags "-s -w" -o "$bin/$1" "$3"
}

# finish: what was built, and the bin folder on stdout.
finish() {
  log "built ${missing[*]} in $(( $(date +%s) - started )) s into $bin"
  # The binaries are cached by version above; Go's own build cache (gigabytes after the Kubernetes builds) is
  # not needed again, and a machine that builds the images next needs the room. KUBERL_KEEP_GOCACHE=1 keeps it.
  [ -n "${KUBERL_KEEP_GOCACHE:-}" ] || go clean -cache >/dev/null 2>&1 || true
  echo "$bin"
}
