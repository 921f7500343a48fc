#!/usr/bin/env bash
# The README's first command: builds the images and starts the compose
# cluster (one head, two workers, the Serve load balancer `lb`, and with GCS
# fault tolerance a Redis), then waits until all three Ray nodes are alive
# and prints the dashboard and Serve URLs.
#
#   scripts/cluster-up.sh [--no-gcs-ft] [--monitoring] [--no-wait] [--no-build] [-- extra `up` args]
#
# GCS fault tolerance is on by default (ARGUS_GCS_FT=1; `--gcs-ft` is still
# accepted): docker-compose.gcs-ft.yaml on top, a Redis service
# (argus/argus-redis, built here from Dockerfile.redis) keeps the GCS state,
# so workers, their Serve replicas and the endpoint ride a head container
# restart through. --no-gcs-ft (or ARGUS_GCS_FT=0): docker-compose.yaml
# alone; a head restart then loses the cluster's state (Serve apps too).
# Serve endpoint: http://localhost:$ARGUS_SERVE_HOST_PORT/ (8000), the `lb`
# service (argus/argus-lb, built here from Dockerfile.lb: HAProxy in front of
# the workers' Serve proxies). It answers once a Serve application listens on
# 0.0.0.0:8000 on the workers (`proxy_location: EveryNode`).
# --monitoring (or ARGUS_MONITORING=1): docker-compose.monitoring.yaml on top,
# a Prometheus service (argus/argus-prometheus, built here from
# Dockerfile.prometheus) on http://localhost:$ARGUS_PROMETHEUS_HOST_PORT/
# (9090) scraping every agent and every Ray node, with the alert rules of
# docker/prometheus/rules (docs/operations.md).
# Choices made for you (override by environment):
#   - Ray base: rayproject/ray:2.53.0-py311 if present or pullable, else the
#     registry-free argus/ray-base (scripts/build-base-image.sh, needs root).
#     ARGUS_BASE_IMAGE=... forces one.
#   - agent: the prebuilt target/cluster/argus-agent (`cargo build --profile
#     cluster`: release without LTO, Cargo.toml) when cargo is here,
#     else compiled in the Rust build stage. ARGUS_PREBUILT=0|1 forces one.
#   - compose: `docker compose` (v2) if present, else `docker-compose` (v1).
#   - images: ARGUS_NODE_IMAGE, ARGUS_REDIS_IMAGE, ARGUS_LB_IMAGE,
#     ARGUS_PROMETHEUS_IMAGE (default
#     argus/argus-{ray-node,redis,lb,prometheus}:$ARGUS_VERSION, ARGUS_VERSION=dev).
# Host preparation: ARGUS_MODEL_CACHE (/tmp/argus-models) is created;
# the node needs no group of the Docker socket (only its agent, root, opens
# it). Everything else:
# docker-compose.yaml's header.
# Stop it with the same files:
#   docker compose -f docker-compose.yaml -f docker-compose.gcs-ft.yaml down -v
#   (or docker-compose ...; `down -v --remove-orphans` with docker-compose.yaml
#   alone also removes the Redis)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'cluster-up: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

wait_nodes=1 build=1 gcs_ft=${ARGUS_GCS_FT:-1} monitoring=${ARGUS_MONITORING:-0} up_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-wait) wait_nodes=0 ;;
    --no-build) build=0 ;;
    --gcs-ft) gcs_ft=1 ;;
    --no-gcs-ft) gcs_ft=0 ;;
    --monitoring) monitoring=1 ;;
    --) shift; up_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "Docker daemon not reachable"
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose=(docker-compose)
else
  die "neither 'docker compose' nor 'docker-compose' found"
fi

case $gcs_ft in
  0|1) ;;
  *) die "ARGUS_GCS_FT must be 0 or 1, not '$gcs_ft'" ;;
esac
case $monitoring in
  0|1) ;;
  *) die "ARGUS_MONITORING must be 0 or 1, not '$monitoring'" ;;
esac
files=(-f docker-compose.yaml)
[ "$gcs_ft" = 1 ] && files+=(-f docker-compose.gcs-ft.yaml)
[ "$monitoring" = 1 ] && files+=(-f docker-compose.monitoring.yaml)
compose+=("${files[@]}")

RAY_VERSION=${RAY_VERSION:-2.53.0}
official=rayproject/ray:${RAY_VERSION}-py311
export ARGUS_NODE_IMAGE=${ARGUS_NODE_IMAGE:-argus/argus-ray-node:${ARGUS_VERSION:-dev}}
export ARGUS_REDIS_IMAGE=${ARGUS_REDIS_IMAGE:-argus/argus-redis:${ARGUS_VERSION:-dev}}
export ARGUS_LB_IMAGE=${ARGUS_LB_IMAGE:-argus/argus-lb:${ARGUS_VERSION:-dev}}
export ARGUS_PROMETHEUS_IMAGE=${ARGUS_PROMETHEUS_IMAGE:-argus/argus-prometheus:${ARGUS_VERSION:-dev}}
export ARGUS_MODEL_CACHE=${ARGUS_MODEL_CACHE:-/tmp/argus-models}

# The build runs what does not depend on each other side by side (measured on
# a fresh machine in docs/images.md): the agent's cargo build next to the Ray
# base image and then next to the node image's layers below the binary, the
# Redis and lb images next to those; the node image then only adds the agent. Each step's
# output goes to $ARGUS_BUILD_LOGS (target/cluster-up-logs), its time to stderr.
build_logs=${ARGUS_BUILD_LOGS:-target/cluster-up-logs}
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }
# step NAME CMD...: runs CMD in the background, output to $build_logs/NAME.log;
# its pid goes to pids[NAME].
declare -A pids=()
step() {
  local name=$1; shift
  ( s=$(date +%s); rc=0; "$@" >"$build_logs/$name.log" 2>&1 || rc=$?
    log "  $name: exit $rc after $(( $(date +%s) - s )) s (log $build_logs/$name.log)"; exit $rc ) &
  pids[$name]=$!
}
# finish NAME: waits for step NAME, dies with its log's tail when it failed.
finish() {
  wait "${pids[$1]}" || { tail -n 20 "$build_logs/$1.log" >&2; die "$1 failed (log $build_logs/$1.log)"; }
}

if [ $build = 1 ]; then
  mkdir -p "$build_logs"
  prebuilt=${ARGUS_PREBUILT:-$(command -v cargo >/dev/null && echo 1 || echo 0)}
  if [ "$prebuilt" = 1 ]; then
    log "building the agent (cargo build --profile cluster) alongside the base image"
    # The `cluster` profile (Cargo.toml): release without LTO, 64 s less
    # than release's fat LTO on 2 cores. Behind the image builds for the
    # CPU: their chain (base, node-common) is one step after another, cargo
    # fills what it leaves (10 s better than the same priority in one run
    # each, docs/images.md).
    step agent nice -n 5 cargo build --profile cluster --locked -p argus-agent
  fi
  if [ -z "${ARGUS_BASE_IMAGE:-}" ]; then
    if docker image inspect "$official" >/dev/null 2>&1 \
       || timeout 900 docker pull "$official" >/dev/null 2>&1; then
      ARGUS_BASE_IMAGE=$official
    else
      log "$official is neither here nor pullable: using a local Ray base"
      ARGUS_BASE_IMAGE=argus/ray-base:${RAY_VERSION}-py311
      if ! docker image inspect "$ARGUS_BASE_IMAGE" >/dev/null 2>&1; then
        step base scripts/build-base-image.sh
        finish base
      fi
    fi
  fi
  export ARGUS_BASE_IMAGE
  # The node image's layers below the agent binary, while cargo still runs.
  step node-common env BASE_IMAGE="$ARGUS_BASE_IMAGE" scripts/build-images.sh node-common
  # The Redis, lb and Prometheus images (with the local base: on the bare
  # Debian image that scripts/build-base-image.sh also imports), beside
  # node-common. Started beside pip instead, they slowed the base more than
  # they gained (docs/images.md).
  if [ "$gcs_ft" = 1 ]; then
    step redis env BASE_IMAGE="$ARGUS_BASE_IMAGE" ARGUS_VERSION="${ARGUS_REDIS_IMAGE##*:}" scripts/build-images.sh redis
  fi
  step lb env BASE_IMAGE="$ARGUS_BASE_IMAGE" ARGUS_VERSION="${ARGUS_LB_IMAGE##*:}" scripts/build-images.sh lb
  if [ "$monitoring" = 1 ]; then
    step monitoring env BASE_IMAGE="$ARGUS_BASE_IMAGE" ARGUS_VERSION="${ARGUS_PROMETHEUS_IMAGE##*:}" scripts/build-images.sh monitoring
  fi
  flags=(node)
  finish node-common
  if [ "$prebuilt" = 1 ]; then
    finish agent
    flags+=(--prebuilt --agent-binary target/cluster/argus-agent)
  fi
  step node env BASE_IMAGE="$ARGUS_BASE_IMAGE" ARGUS_VERSION="${ARGUS_NODE_IMAGE##*:}" scripts/build-images.sh "${flags[@]}"
  for name in node redis lb monitoring; do [ -z "${pids[$name]:-}" ] || finish "$name"; done
  log "images built in $(elapsed)"
fi

mkdir -p "$ARGUS_MODEL_CACHE"

serve_url=http://localhost:${ARGUS_SERVE_HOST_PORT:-8000}/
log "${compose[*]} up -d"
"${compose[@]}" up -d --no-build "${up_args[@]}"

if [ $wait_nodes = 0 ]; then
  log "Serve endpoint (lb): $serve_url"
  exit 0
fi
head=$("${compose[@]}" ps -q head)
deadline=$(( $(date +%s) + ${ARGUS_UP_TIMEOUT_S:-300} ))
log "waiting for 3 alive Ray nodes (up to ${ARGUS_UP_TIMEOUT_S:-300} s)"
while :; do
  out=$(docker exec "$head" argus-agent ray-tool nodes </dev/null 2>/dev/null || true)
  alive=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["alive"])' 2>/dev/null || echo 0)
  if [ "$alive" -ge 3 ]; then
    if [ "$gcs_ft" = 1 ]; then
      log "GCS fault tolerance on: Redis service 'redis' (docker-compose.gcs-ft.yaml)"
    else
      log "GCS fault tolerance off (--no-gcs-ft): a head restart loses the cluster's state"
    fi
    log "cluster up in $(elapsed): $alive Ray nodes alive; dashboard http://localhost:${ARGUS_DASHBOARD_HOST_PORT:-8265}"
    log "Serve endpoint (lb, the workers' Serve proxies): $serve_url"
    if [ "$monitoring" = 1 ]; then
      log "Prometheus (agents, Ray nodes, alert rules: docs/operations.md): http://localhost:${ARGUS_PROMETHEUS_HOST_PORT:-9090}/"
    fi
    log "stop: ${compose[*]} down -v"
    exit 0
  fi
  [ "$(date +%s)" -lt "$deadline" ] || { "${compose[@]}" ps >&2; die "only $alive Ray nodes alive after ${ARGUS_UP_TIMEOUT_S:-300} s"; }
  sleep 3
done
