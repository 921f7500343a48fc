#!/usr/bin/env bash
# A/B of two agent binaries: brokered `podman version` through an agent of
# binary A and one of binary B, alternating, N runs each; plus the
# in-process call of B. Prints medians (us) and the median paired difference.
#
#   scripts/bench-shim-ab.sh A_BINARY B_BINARY [N]   (default 200)
#
# Used for the report pipe (podman/src/report.rs): A built from the commit
# before it, B after; run it both ways round on a busy machine.
set -euo pipefail
A=$1 B=$2 N=${3:-200}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$tmp"' EXIT
start() { # name bin
    local n=$tmp/$1
    mkdir -p "$n/shared" "$n/state" "$n/bin" "$n/cli"
    cp /bin/sleep "$n/bin/raylet"; cp /bin/sleep "$n/bin/gcs_server"
    ln -s "$2" "$n/cli/podman"
    env -i PATH="$PATH" ARGUS_ROLE=head ARGUS_SHARED_ROOT="$n/shared" ARGUS_STATE_DIR="$n/state" \
        ARGUS_LOG_DIR="$n/logs" ARGUS_RAY_BIN="$PWD/tests/fixtures/fake-ray" FAKE_RAY_BINDIR="$n/bin" \
        ARGUS_NODE_IP=127.0.0.1 RAY_TMPDIR="$n/raytmp" ARGUS_PREFLIGHT=skip ARGUS_DISABLE_PRESTART=1 \
        ARGUS_RAY_PORT="$(free_port)" ARGUS_DASHBOARD_PORT="$(free_port)" ARGUS_METRICS_PORT="$(free_port)" \
        "$2" run 2>"$n/agent.log" &
    pids+=($!)
    for _ in $(seq 100); do [[ -S $n/state/shim.sock ]] && break; sleep 0.1; done
    [[ -S $n/state/shim.sock ]] || { cat "$n/agent.log"; exit 1; }
}
start a "$A"; start b "$B"
mkdir -p "$tmp/none"
t() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); echo $(((t1 - t0) / 1000)); }
median() { sort -n | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
sleep 1
for x in a b; do ARGUS_STATE_DIR=$tmp/$x/state "$tmp/$x/cli/podman" version >/dev/null; done
: >"$tmp/ta"; : >"$tmp/tb"; : >"$tmp/td"
for ((i = 0; i < N; i++)); do
    ARGUS_STATE_DIR=$tmp/a/state t "$tmp/a/cli/podman" version >>"$tmp/ta"
    ARGUS_STATE_DIR=$tmp/b/state t "$tmp/b/cli/podman" version >>"$tmp/tb"
    ARGUS_STATE_DIR=$tmp/none t "$tmp/b/cli/podman" version >>"$tmp/td"
done
a=$(median <"$tmp/ta"); b=$(median <"$tmp/tb"); d=$(median <"$tmp/td")
echo "runs each: $N (alternating)"
echo "in-process podman version (B):       median $d us"
echo "brokered through A:                  median $a us  (broker cost $(awk -v x=$a -v y=$d 'BEGIN{printf "%+.2f", (x-y)/1000}') ms)"
echo "brokered through B:                  median $b us  (broker cost $(awk -v x=$b -v y=$d 'BEGIN{printf "%+.2f", (x-y)/1000}') ms)"
echo "B - A: difference of medians $(awk -v x=$b -v y=$a 'BEGIN{printf "%+.3f", (x-y)/1000}') ms; median paired difference $(paste "$tmp/tb" "$tmp/ta" | awk '{print $1-$2}' | median) us"
