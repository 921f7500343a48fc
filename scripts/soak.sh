#!/usr/bin/env bash
# Chaos soak of the compose cluster (issue 9.3): real Docker, real Ray, the
# node image of this checkout and the stand-in engine image, with GCS fault
# tolerance (Redis) and the Serve endpoint (lb) as scripts/cluster-up.sh
# brings them up (--no-gcs-ft: without the Redis).
#
#   scripts/soak.sh [--faults N] [--seed S] [--no-build] [soak.py options]
#
# Builds (unless --no-build) the agent (`cargo build`, the debug build the
# compose tests use too; ARGUS_SOAK_CARGO_PROFILE=release for release), the node
# image argus/argus-ray-node:$ARGUS_VERSION (default soak) from it on the
# registry-free Ray base, and the stand-in engine image
# localhost/neutree/engine-vllm:stub-a-ray2.53.0 (--no-vllm) when missing;
# then runs scripts/soak.py: a compose project of its own, N faults drawn at
# random (seeded), invariants checked after each, a table and a summary;
# exit 1 when an invariant broke. The cluster is always torn down.
# `scripts/soak.py --help` lists the options (bounds per fault kind, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

build=1 args=()
for a in "$@"; do
  case $a in
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exec python3 scripts/soak.py --help ;;
    *) args+=("$a") ;;
  esac
done

export ARGUS_VERSION=${ARGUS_VERSION:-soak}
node_image=argus/argus-ray-node:$ARGUS_VERSION
engine=localhost/neutree/engine-vllm:stub-a-ray2.53.0
if [ $build = 1 ]; then
  scripts/build-base-image.sh >/dev/null
  profile=${ARGUS_SOAK_CARGO_PROFILE:-dev}
  cargo build --profile "$profile" -p argus-agent --bin argus-agent
  dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
  mkdir -p target/e2e
  cp "target/$dir/argus-agent" target/e2e/argus-agent
  scripts/build-images.sh node --prebuilt --local-base --agent-binary target/e2e/argus-agent >/dev/null
  docker image inspect "$engine" >/dev/null 2>&1 ||
    scripts/build-images.sh engine --local-base --no-vllm --engine-version stub-a >/dev/null
fi
# The Serve endpoint (lb) and GCS fault tolerance's Redis: built from this
# checkout every time, also with --no-build (seconds from Docker's cache; an
# image of an older checkout, e.g. a Redis without the password the head
# reads, would not do).
lb_image=argus/argus-lb:$ARGUS_VERSION
redis_image=argus/argus-redis:$ARGUS_VERSION
scripts/build-images.sh lb redis --local-base >/dev/null
exec python3 scripts/soak.py --node-image "$node_image" --engine-image "$engine" \
  --lb-image "$lb_image" --redis-image "$redis_image" "${args[@]}"
