#!/usr/bin/env bash
# Benchmark of the podman shim (issue 4): `podman run --rm IMG true` through
# the shim against `docker run --rm IMG true` with the docker CLI, on the
# same daemon; prints the medians, their ratio and the release binary size.
#
#   scripts/bench-shim.sh [RUNS]        (default 15 runs each, at least 10)
#
# Needs the docker CLI (only as the reference) and the test image of the
# shim tests (`argus-shim-test:*`, built by `cargo test --test shim_docker`)
# or any local image with a `true` command (IMAGE=...). Builds the release
# binary if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-15}
if ((runs < 10)); then
    echo "bench-shim: at least 10 runs each" >&2
    exit 2
fi
bin=target/release/argus-agent
if [[ ! -x $bin ]]; then
    cargo build --release -p argus-agent
fi
image=${IMAGE:-$(docker images --format '{{.Repository}}:{{.Tag}}' 'argus-shim-test' | head -n1)}
if [[ -z $image ]]; then
    echo "bench-shim: no test image; run: cargo test -p argus-agent --test shim_docker run_relays" >&2
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ln -s "$(realpath "$bin")" "$tmp/podman"

# Prints the wall time of "$@" in milliseconds.
time_ms() {
    local t0 t1
    t0=$(date +%s%N)
    "$@" >/dev/null
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# One warm-up each, then alternate so both see the same daemon load.
"$tmp/podman" run --rm "$image" true >/dev/null
docker run --rm "$image" true >/dev/null
: >"$tmp/shim"
: >"$tmp/cli"
for ((i = 0; i < runs; i++)); do
    time_ms "$tmp/podman" run --rm "$image" true >>"$tmp/shim"
    time_ms docker run --rm "$image" true >>"$tmp/cli"
done
shim=$(median <"$tmp/shim")
cli=$(median <"$tmp/cli")
size=$(stat -c %s "$bin")
echo "image:                 $image"
echo "runs each:             $runs"
echo "shim   podman run --rm: median ${shim} ms  (all: $(tr '\n' ' ' <"$tmp/shim"))"
echo "docker docker run --rm: median ${cli} ms  (all: $(tr '\n' ' ' <"$tmp/cli"))"
echo "ratio shim/docker:     $(awk -v a="$shim" -v b="$cli" 'BEGIN {printf "%.2f", a / b}')"
echo "release binary:        $size bytes ($(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1048576}') MiB), $bin"
