#!/usr/bin/env bash
# Measures the images and the compose cluster (issue 5, benchmark):
#   1. node image size over its base image (bytes and MB);
#   2. seconds from `compose up -d` to three alive Ray nodes;
#   3. seconds from `docker kill` of the head container and bringing up a new
#      one to all workers rejoined (three alive nodes, all new Ray node ids).
# Uses its own compose project (argus-bench) and tears it down at the end.
# The cluster settings come from the environment like docker-compose.yaml's
# (e.g. ARGUS_TTL_S=6 ARGUS_REFRESH_S=2 ARGUS_POLL_S=1); they are printed.
#
#   scripts/bench-images.sh            # images must exist (scripts/build-images.sh)
# Environment: ARGUS_NODE_IMAGE (argus/argus-ray-node:dev), BASE_IMAGE (the
# node image's base, default argus/ray-base:2.53.0-py311), RUNS (1).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'bench-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
export ARGUS_NODE_IMAGE=${ARGUS_NODE_IMAGE:-argus/argus-ray-node:dev}
BASE_IMAGE=${BASE_IMAGE:-argus/ray-base:2.53.0-py311}
export ARGUS_DASHBOARD_HOST_PORT=${ARGUS_DASHBOARD_HOST_PORT:-18266}
export ARGUS_MODEL_CACHE=${ARGUS_MODEL_CACHE:-/tmp/argus-models}
mkdir -p "$ARGUS_MODEL_CACHE"
project=argus-bench
dc() { "${compose[@]}" -p "$project" -f docker-compose.yaml "$@"; }
cleanup() { dc down -v -t 150 >/dev/null 2>&1 || true; }  # -t past a worker's drain
trap cleanup EXIT

now() { date +%s.%N; }
secs() { python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }

# Prints the alive node ids, one a line, or nothing.
alive_ids() {
  local head
  head=$(dc ps -q head 2>/dev/null) || return 0
  [ -n "$head" ] || return 0
  docker exec "$head" timeout 60 argus-agent ray-tool nodes </dev/null 2>/dev/null \
    | python3 -c 'import json,sys; [print(n["id"]) for n in json.load(sys.stdin)["nodes"] if n["alive"]]' 2>/dev/null || true
}

# Waits for 3 alive nodes none of whose ids are in $1 (a file); up to 600 s.
wait_three_new() {
  local old=$1 deadline=$(( $(date +%s) + 600 )) ids
  while [ "$(date +%s)" -lt "$deadline" ]; do
    ids=$(alive_ids)
    if [ "$(printf '%s' "$ids" | grep -c .)" -eq 3 ] && ! printf '%s\n' "$ids" | grep -qxFf "$old"; then
      printf '%s\n' "$ids"
      return 0
    fi
    sleep 1
  done
  dc logs --tail 40 >&2
  die "no 3 new alive nodes within 600 s"
}

docker image inspect "$ARGUS_NODE_IMAGE" >/dev/null 2>&1 || die "$ARGUS_NODE_IMAGE missing (scripts/build-images.sh)"
node_size=$(docker image inspect -f '{{.Size}}' "$ARGUS_NODE_IMAGE")
if base_size=$(docker image inspect -f '{{.Size}}' "$BASE_IMAGE" 2>/dev/null); then
  echo "node image: $ARGUS_NODE_IMAGE $node_size bytes; base $BASE_IMAGE $base_size bytes;" \
       "node over base: $((node_size - base_size)) bytes ($(( (node_size - base_size) / 1000 )) kB)"
else
  echo "node image: $ARGUS_NODE_IMAGE $node_size bytes; base $BASE_IMAGE not present"
fi
echo "settings: TTL_S=${ARGUS_TTL_S:-60} REFRESH_S=${ARGUS_REFRESH_S:-10} POLL_S=${ARGUS_POLL_S:-5}"

none=$(mktemp); before=$(mktemp); trap 'cleanup; rm -f "$none" "$before"' EXIT
for run in $(seq 1 "${RUNS:-1}"); do
  cleanup
  t0=$(now)
  dc up -d --no-build >/dev/null 2>&1 || die "compose up failed"
  wait_three_new "$none" >"$before"
  t1=$(now)
  echo "run $run: compose up -> 3 nodes alive: $(secs "$t0" "$t1") s"

  old_head=$(dc ps -q head)
  t0=$(now)
  docker kill "$old_head" >/dev/null
  dc up -d --no-build --no-deps --force-recreate head >/dev/null 2>&1 || die "recreating head failed"
  wait_three_new "$before" >/dev/null
  t1=$(now)
  echo "run $run: head container replaced -> all workers rejoined: $(secs "$t0" "$t1") s"
done
