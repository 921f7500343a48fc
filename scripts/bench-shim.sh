#!/usr/bin/env bash
# Benchmark of the podman shim: `podman run --rm IMG true` through the shim
# against `docker run --rm IMG true` with the docker CLI, on the same daemon;
# then the same call brokered by a node agent (the `podman` client hands it
# to the agent, whose handler process runs it) against the shim running it
# in-process, side by side in one run, with the agent's RSS idle and after
# the brokered calls. Prints medians, ratios and the release binary size.
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

# --- brokered by a node agent vs in-process --------------------------------
# An agent (head, fake ray: the broker does not need Ray) whose state folder
# holds shim.sock; `podman` finds it through ARGUS_STATE_DIR.
node=$tmp/node
mkdir -p "$node/shared" "$node/state" "$node/bin" "$node/none"
cp /bin/sleep "$node/bin/raylet"
cp /bin/sleep "$node/bin/gcs_server"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
env -i PATH="$PATH" ARGUS_ROLE=head ARGUS_SHARED_ROOT="$node/shared" ARGUS_STATE_DIR="$node/state" \
    ARGUS_LOG_DIR="$node/logs" ARGUS_RAY_BIN="$PWD/tests/fixtures/fake-ray" FAKE_RAY_BINDIR="$node/bin" \
    ARGUS_NODE_IP=127.0.0.1 RAY_TMPDIR="$node/raytmp" ARGUS_PREFLIGHT=skip ARGUS_DISABLE_PRESTART=1 \
    ARGUS_RAY_PORT="$(free_port)" ARGUS_DASHBOARD_PORT="$(free_port)" \
    "$bin" run 2>"$node/agent.log" &
agent=$!
trap 'kill $agent 2>/dev/null; wait $agent 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do [[ -S $node/state/shim.sock ]] && break; sleep 0.1; done
[[ -S $node/state/shim.sock ]] || { echo "bench-shim: the agent's broker did not come up" >&2; cat "$node/agent.log" >&2; exit 1; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$agent/status"; }
time_us() {
    local t0 t1
    t0=$(date +%s%N)
    "$@" >/dev/null
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000))
}
sleep 1
rss_idle=$(rss)
ARGUS_STATE_DIR=$node/state "$tmp/podman" run --rm "$image" true >/dev/null
ARGUS_STATE_DIR=$node/none "$tmp/podman" run --rm "$image" true >/dev/null
: >"$tmp/broker"
: >"$tmp/direct"
for ((i = 0; i < runs; i++)); do
    ARGUS_STATE_DIR=$node/state time_ms "$tmp/podman" run --rm "$image" true >>"$tmp/broker"
    ARGUS_STATE_DIR=$node/none time_ms "$tmp/podman" run --rm "$image" true >>"$tmp/direct"
done
# The broker's own cost, without a container's life around it: `version`
# (one daemon request), many more runs.
: >"$tmp/broker_v"
: >"$tmp/direct_v"
for ((i = 0; i < 4 * runs; i++)); do
    ARGUS_STATE_DIR=$node/state time_us "$tmp/podman" version >>"$tmp/broker_v"
    ARGUS_STATE_DIR=$node/none time_us "$tmp/podman" version >>"$tmp/direct_v"
done
sleep 1
rss_after=$(rss)
broker=$(median <"$tmp/broker")
direct=$(median <"$tmp/direct")
echo "in-process podman run --rm: median ${direct} ms  (all: $(tr '\n' ' ' <"$tmp/direct"))"
echo "brokered   podman run --rm: median ${broker} ms  (all: $(tr '\n' ' ' <"$tmp/broker"))"
echo "broker cost:               $(awk -v a="$broker" -v b="$direct" 'BEGIN {printf "%+.1f", a - b}') ms per call (difference of the medians); median of the paired differences: $(paste "$tmp/broker" "$tmp/direct" | awk '{print $1 - $2}' | median) ms"
broker_v=$(median <"$tmp/broker_v")
direct_v=$(median <"$tmp/direct_v")
echo "in-process podman version:  median ${direct_v} us over $((4 * runs)) runs"
echo "brokered   podman version:  median ${broker_v} us"
echo "broker fixed cost:         $(awk -v a="$broker_v" -v b="$direct_v" 'BEGIN {printf "%+.1f", (a - b) / 1000}') ms per call (connect, handler process, streams)"
echo "agent RSS:                 ${rss_idle} KiB idle with the broker listening, ${rss_after} KiB after $((runs + 1)) brokered calls"
