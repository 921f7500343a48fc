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
set -euo pipefail
cd "$(dirname "$0")/.."
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
