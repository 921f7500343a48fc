#!/usr/bin/env bash
# Builds the images the Docker tests use, once per run of scripts/test, so
# that no test builds an image while another starts from it (every test runs
# in its own process under cargo-nextest).
#
#   scripts/build-test-images.sh services        the Ray base (cached), the
#       Redis, lb and Prometheus images and the two stand-in engine images
#       (stub-a, stub-b)
#   scripts/build-test-images.sh node BINARY     the node image from BINARY
#       (the test build's target/debug/argus-agent), staged at
#       target/e2e/argus-agent
#   scripts/build-test-images.sh vllm            the CPU engine images of
#       vLLM 0.12.0 and 0.13.0 (tests/engine_vllm.rs; about 9 GB on a fresh
#       machine, cached by their inputs' hash)
#
# Tags use ARGUS_E2E_VERSION (default e2e), as tests/support/compose.rs does.
# The tests check that each image is there when ARGUS_E2E_IMAGES=prebuilt
# (scripts/test sets it once this script succeeded) and build it themselves
# otherwise. Each finished image prints "build-test-images: <tag> ready in N s".
set -euo pipefail
cd "$(dirname "$0")/.."

version=${ARGUS_E2E_VERSION:-e2e}
say() { printf 'build-test-images: %s\n' "$*" >&2; }
timed() {
    local what=$1 s
    shift
    s=$(date +%s)
    "$@" >/dev/null
    say "$what ready in $(( $(date +%s) - s )) s"
}

case ${1:-} in
services)
    timed "Ray base image" scripts/build-base-image.sh
    # The services beside the stand-in engines (they share no lock), and
    # the stand-ins first on the engine lock: the CPU vLLM engines, which
    # the caller starts once the stand-ins are ready (the `stubs-ready`
    # file), take it for many minutes.
    timed "redis, lb and prometheus images (:$version)" \
        env ARGUS_VERSION="$version" scripts/build-images.sh redis lb monitoring --local-base &
    services=$!
    for v in stub-a stub-b; do
        timed "stand-in engine image $v" \
            scripts/build-images.sh engine --local-base --no-vllm --engine-version "$v"
    done
    [ -z "${ARGUS_STUBS_READY:-}" ] || : >"$ARGUS_STUBS_READY"
    wait "$services"
    ;;
node)
    binary=${2:?usage: build-test-images.sh node BINARY}
    mkdir -p target/e2e
    # A temporary name first: a test run alone may be building from the
    # staged binary.
    cp "$binary" target/e2e/argus-agent.tmp
    mv target/e2e/argus-agent.tmp target/e2e/argus-agent
    timed "node image argus/argus-ray-node:$version" \
        env ARGUS_VERSION="$version" scripts/build-images.sh node --prebuilt --local-base \
        --agent-binary target/e2e/argus-agent
    ;;
vllm)
    for v in 0.12.0 0.13.0; do
        timed "CPU engine image v$v" \
            env VLLM_VERSION="$v" scripts/build-images.sh engine --local-base --cpu --engine-version "v$v"
    done
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
