#!/usr/bin/env bash
# Times the healthy path of `argus-agent preflight --json` on a fake GPU node
# (device root, the stand-in nvidia-smi, stand-in libcuda.so.1 and
# libnvidia-ml.so.1 from tests/fixtures/gpu) and prints min, median, p90 and
# max wall time over many runs. Every run must pass (exit 0), or it stops.
#
#   RUNS=50 GPUS=8 PROFILE=release scripts/bench-preflight.sh
#   PROFILE=dev scripts/bench-preflight.sh     # reuse the debug build
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-50}"
GPUS="${GPUS:-8}"
PROFILE="${PROFILE:-release}"

cargo build --quiet --profile "$PROFILE" -p argus-agent
case "$PROFILE" in
  dev) bin="$PWD/target/debug/argus-agent" ;;
  *) bin="$PWD/target/$PROFILE/argus-agent" ;;
esac

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/root/dev" "$tmp/bin" "$tmp/lib" "$tmp/logs" "$tmp/state"
touch "$tmp/root/dev/nvidiactl" "$tmp/root/dev/nvidia-uvm"
for ((i = 0; i < GPUS; i++)); do touch "$tmp/root/dev/nvidia$i"; done
cp tests/fixtures/gpu/nvidia-smi "$tmp/bin/"
gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$tmp/lib/libcuda.so.1" tests/fixtures/gpu/libcuda.c
gcc -shared -fPIC -O1 -Wl,-soname,libnvidia-ml.so.1 -o "$tmp/lib/libnvidia-ml.so.1" tests/fixtures/gpu/libnvidia-ml.c

run() {
  env -i PATH="$tmp/bin:/usr/bin:/bin" LD_LIBRARY_PATH="$tmp/lib" \
    ARGUS_PREFLIGHT=require ARGUS_PREFLIGHT_DEV_ROOT="$tmp/root" \
    ARGUS_LOG_DIR="$tmp/logs" ARGUS_STATE_DIR="$tmp/state" \
    NVIDIA_VISIBLE_DEVICES=all FAKE_SMI_GPUS="$GPUS" FAKE_NVML_COUNT="$GPUS" FAKE_CUDA_COUNT="$GPUS" \
    "$bin" preflight --json > "$tmp/out.json"
}

run || { echo "warm-up run failed (exit $?):" >&2; cat "$tmp/out.json" >&2; exit 1; }
: > "$tmp/times"
for ((r = 0; r < RUNS; r++)); do
  start=$(date +%s%N)
  if ! run; then
    echo "run $r failed (exit $?):" >&2
    cat "$tmp/out.json" >&2
    exit 1
  fi
  end=$(date +%s%N)
  echo $(((end - start) / 1000)) >> "$tmp/times"
done
sort -n "$tmp/times" > "$tmp/sorted"
pick() { sed -n "$1p" "$tmp/sorted"; }
n=$(wc -l < "$tmp/sorted")
median=$(pick $(((n + 1) / 2)))
p90=$(pick $(((n * 9 + 9) / 10)))
printf 'preflight healthy path, %d GPUs, %s build, %d runs: min %d us, median %d us, p90 %d us, max %d us\n' \
  "$GPUS" "$PROFILE" "$n" "$(pick 1)" "$median" "$p90" "$(pick "$n")"
