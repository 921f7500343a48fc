#!/usr/bin/env bash
# Replaces every node container of a running compose cluster, one at a time,
# workers first and the head last (R-SERVE-4, docs/deploy.md "Rolling
# replacement"):
#
#   scripts/roll-cluster.sh [--image IMAGE] [--services "worker-1 worker-2 head"]
#                           [--timeout SECONDS] [-- COMPOSE_ARGS...]
#
#   --image      the node image to run from now on (ARGUS_NODE_IMAGE for
#                compose); default: the one the compose file names now
#   --services   the node services, in order (default: worker-1 worker-2 head)
#   --timeout    how long one node may take to come back (default 600)
#   COMPOSE_ARGS what the cluster was brought up with: -p PROJECT -f FILE ...
#
# For each node:
# 1. `docker stop`: the agent drains first (a worker moves its Serve
#    replicas to another worker, waits until the load balancer has that one
#    up, tells the lb `drain`, waits for its replicas and proxy to finish),
#    then stops Ray; the container's stop timeout bounds it;
# 2. `compose up -d --no-deps --force-recreate SERVICE` with the new image;
# 3. waits until the new container's agent is running, its node is alive in
#    Ray (seen from the head), and at least one worker's Serve proxy serves
#    (the worker's status says `serve_proxy: serving`) when one served
#    before: a replaced worker may hold no replica until the next worker's
#    drain moves replicas to it, which is what that drain waits for.
# The head must come back at its address: with GCS fault tolerance the
# workers then ride its restart through (their Ray, proxies and replicas keep
# running); at another address they rejoin, which restarts their Ray and
# loses what their replicas had in flight. Docker gives a recreated
# container its old address when nothing took it meanwhile; the script says
# so when it did not.
# After the last node, the roll waits (up to --spread-timeout, default 300 s)
# until every Serve deployment with two or more replicas runs them on at
# least two nodes again (R-SERVE-8: the drains moved each worker's replicas
# to the other; the node image's Serve moves them back, start-first, one at
# a time) and says where they run (docker/tools/serve_placement.py).
# One line per node: "roll: HH:MM:SS SERVICE replaced in Ns (stop Ns, back Ns)",
# then "roll: HH:MM:SS balanced: APP/DEPLOYMENT IP=N IP=N ..." (or a warning
# naming the deployments still on one node).
# Exits 1 naming the node that did not come back.
set -euo pipefail
cd "$(dirname "$0")/.."

image= services="worker-1 worker-2 head" timeout=600 spread_timeout=300
while [ $# -gt 0 ]; do
  case $1 in
    --image) image=$2; shift ;;
    --services) services=$2; shift ;;
    --timeout) timeout=$2; shift ;;
    --spread-timeout) spread_timeout=$2; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "roll: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose "$@")
else
  compose=(docker-compose "$@")
fi
[ -n "$image" ] && export ARGUS_NODE_IMAGE=$image

say() { printf 'roll: %s %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { say "error: $*" >&2; exit 1; }
cid() { "${compose[@]}" ps -q "$1" 2>/dev/null | head -1; }
# The address on the compose network (a GCS FT head is also on Redis's own).
addr() {
  docker inspect --format '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}={{$v.IPAddress}} {{end}}' "$1" 2>/dev/null |
    tr ' ' '\n' | awk -F= 'NF == 2 { if ($1 ~ /_default$/) d = $2; else if (f == "") f = $2 } END { print (d != "" ? d : f) }'
}
status() { docker exec "$1" argus-agent status --json 2>/dev/null || true; }
field() { python3 -c 'import json,sys; v=json.load(sys.stdin); print(v.get(sys.argv[1]) or "")' "$1" 2>/dev/null || true; }

# Node IPs Ray sees alive, from the head.
ray_alive() {
  local head
  head=$(cid head)
  [ -n "$head" ] || return 0
  docker exec "$head" timeout 60 argus-agent ray-tool nodes </dev/null 2>/dev/null |
    python3 -c 'import json,sys; print(" ".join(n["ip"] for n in json.load(sys.stdin)["nodes"] if n["alive"]))' 2>/dev/null || true
}

# Workers whose Serve proxy serves now.
serving() {
  local n=0 s id
  for s in $services; do
    [ "$s" = head ] && continue
    id=$(cid "$s")
    [ -n "$id" ] || continue
    [ "$(status "$id" | field serve_proxy)" = serving ] && n=$((n + 1))
  done
  echo $n
}

for svc in $services; do
  old=$(cid "$svc")
  [ -n "$old" ] || die "no container for $svc"
  served_before=$(serving)
  old_addr=$(addr "$old")
  t0=$(date +%s)
  say "$svc: docker stop (drains first)"
  docker stop "$old" >/dev/null
  t1=$(date +%s)
  "${compose[@]}" up -d --no-deps --force-recreate "$svc" >/dev/null 2>&1 ||
    die "compose could not recreate $svc"
  new=$(cid "$svc")
  if [ "$svc" = head ] && [ "$(addr "$new")" != "$old_addr" ]; then
    say "warning: the head came back at $(addr "$new") instead of $old_addr: the workers rejoin it (their Ray restarts)" >&2
  fi
  deadline=$((t1 + timeout))
  while :; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$svc did not come back within ${timeout}s"
    st=$(status "$new")
    ip=$(printf '%s' "$st" | field node_ip)
    if [ "$(printf '%s' "$st" | field state)" = running ] && [ -n "$ip" ] &&
      [[ " $(ray_alive) " == *" $ip "* ]] &&
      { [ "$served_before" = 0 ] || [ "$(serving)" -gt 0 ]; }; then
      break
    fi
    sleep 2
  done
  t2=$(date +%s)
  say "$svc replaced in $((t2 - t0))s (stop $((t1 - t0))s, back $((t2 - t1))s) on $(docker inspect --format '{{.Config.Image}}' "$new")"
done

# Serve's replicas per node, from the head (one JSON line), and its verdict.
placement() {
  docker exec -i "$(cid head)" timeout 60 argus-agent ray-tool python \
    < docker/tools/serve_placement.py 2>/dev/null || true
}
workers=0
for s in $services; do [ "$s" = head ] || workers=$((workers + 1)); done
if [ "$workers" -ge 2 ]; then
  deadline=$(( $(date +%s) + spread_timeout ))
  while :; do
    p=$(placement)
    lines=$(printf '%s' "$p" | python3 -c '
import json, sys
v = json.load(sys.stdin)
print("yes" if v["spread"] else "no")
for d in v["deployments"]:
    print("%s/%s %s" % (d["app"], d["deployment"],
          " ".join("%s=%d" % kv for kv in sorted(d["nodes"].items())) or "none running"))
' 2>/dev/null || true)
    if [ "${lines%%$'\n'*}" = yes ]; then
      b=$(printf "%s" "$lines" | tail -n +2 | paste -sd ";" | sed "s/;/; /g")
      say "balanced: ${b:-no Serve deployment}"
      break
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      say "warning: Serve's replicas are not spread over two workers after ${spread_timeout}s: $(printf '%s' "$lines" | tail -n +2 | paste -sd ';' | sed 's/;/; /g')" >&2
      break
    fi
    sleep 3
  done
fi
say "done: $services"
