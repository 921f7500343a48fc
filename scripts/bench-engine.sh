#!/usr/bin/env bash
# Benchmarks a real LLM endpoint (the CPU engine images, docs/serve.md):
#   - time to first token and decode rate (median of 10 streamed answers of
#     64 tokens) through the lb (compose network -> HAProxy -> a worker's
#     Serve proxy -> the replica in its engine container, started by the
#     shim), and against vLLM's own OpenAI server with the same image, model
#     and engine options inside the same engine container (no Serve, no lb,
#     no shim): the ratio is the cost of the path;
#   - the cold start of an endpoint (vLLM 0.13.0 replacing 0.12.0): serve
#     deploy -> engine container created (Serve, Ray, the shim) -> running
#     (Docker) -> first answer (Ray worker, replica, vLLM engine init and
#     model load), with vLLM's own "Loading weights took" / "init engine"
#     lines.
# It runs tests/engine_vllm.rs with ARGUS_ENGINE_BENCH=1 (the test builds
# what it needs, cached) and prints its figure lines.
#
#   scripts/bench-engine.sh            # RUNS=N repeats (default 1)
#
#   scripts/bench-engine.sh --stream   # the stream path on a realistic model
# One endpoint (vLLM 0.13.0, CPU image) on a model made on the spot with
# about 110 M random weights (tests/fixtures/bench_llama.py: tens of ms a
# token here), 64-token streamed answers at concurrency 1, 8 and 32 through
# the lb and against vLLM's own server in the same engine container: TTFT
# and inter-token latency p50/p99, output tokens/s. Writes
# target/bench/stream-sweep.json, prints the table and draws
# docs/stream-sweep.png (matplotlib, pinned, in target/plot-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --stream ]; then
  cargo test --test engine_vllm stream_path_sweep -- --ignored --nocapture 2>&1 \
    | grep -E '^(\[engine_vllm|engine_vllm stream sweep|test result|thread)' >&2
  if [ ! -x target/plot-venv/bin/python ]; then
    python3 -m venv target/plot-venv
    target/plot-venv/bin/pip install -q matplotlib==3.10.7
  fi
  exec target/plot-venv/bin/python scripts/plot-stream-sweep.py \
    target/bench/stream-sweep.json docs/stream-sweep.png
fi
runs=${RUNS:-1}
for i in $(seq "$runs"); do
  echo "bench-engine: run $i of $runs" >&2
  out=$(ARGUS_ENGINE_BENCH=1 cargo test --test engine_vllm -- --nocapture 2>&1) || {
    printf '%s\n' "$out" | tail -n 80 >&2
    echo "bench-engine: the test failed" >&2
    exit 1
  }
  printf '%s\n' "$out" | grep -E -A12 '^engine_vllm (cold start|bench|figures)' | grep -vE '^(test |running |----)'
done
