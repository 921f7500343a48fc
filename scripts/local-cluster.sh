#!/usr/bin/env bash
# Brings up a Ray cluster of two argus-agent nodes on this machine (head on
# 127.0.0.2, worker on 127.0.0.3) sharing target/local-cluster/shared as
# ARGUS_SHARED_ROOT, with real Ray 2.53.0 from target/ray-venv.
#   scripts/local-cluster.sh          start and wait until both nodes are up
#   scripts/local-cluster.sh status   show both agents' status
#   scripts/local-cluster.sh stop     SIGTERM both agents (they stop Ray)
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
dir=$top/target/local-cluster
venv=$top/target/ray-venv
bin=$top/target/debug/argus-agent
gcs_port=${GCS_PORT:-26379}

node_env() { # role ip
  echo ARGUS_ROLE=$1 ARGUS_NODE_IP=$2 ARGUS_SHARED_ROOT=$dir/shared ARGUS_STATE_DIR=$dir/state-$1 \
    ARGUS_LOG_DIR=$dir/logs ARGUS_RAY_BIN=$venv/bin/ray ARGUS_RAY_PORT=$gcs_port ARGUS_DASHBOARD_PORT=28265 \
    ARGUS_TTL_S=20 ARGUS_REFRESH_S=2 ARGUS_POLL_S=2 ARGUS_PREFLIGHT=auto PATH=$venv/bin:$PATH
}
head_args="--num-cpus=1 --object-store-memory=200000000 --disable-usage-stats --temp-dir=$dir/ray --node-manager-port=26400 --ray-client-server-port=26411 --min-worker-port=26500 --max-worker-port=26599"
worker_args="--num-cpus=2 --object-store-memory=200000000 --disable-usage-stats --node-manager-port=27400 --object-manager-port=27401 --metrics-export-port=27402 --dashboard-agent-listen-port=27403 --dashboard-agent-grpc-port=27404 --runtime-env-agent-port=27405 --min-worker-port=27500 --max-worker-port=27599"

case "${1:-start}" in
  status)
    for r in head worker; do echo "== $r"; ARGUS_STATE_DIR=$dir/state-$r "$bin" status || true; done
    exit 0 ;;
  stop)
    for r in head worker; do
      [ -f "$dir/$r.pid" ] && kill -TERM "$(cat "$dir/$r.pid")" 2>/dev/null || true
    done
    for r in worker head; do
      while [ -f "$dir/$r.pid" ] && kill -0 "$(cat "$dir/$r.pid")" 2>/dev/null; do sleep 0.2; done
      rm -f "$dir/$r.pid"
    done
    echo "stopped"; exit 0 ;;
  start) ;;
  *) echo "usage: $0 [start|status|stop]" >&2; exit 2 ;;
esac

scripts/setup-ray-venv.sh
cargo build -q -p argus-agent
mkdir -p "$dir"
env $(node_env head 127.0.0.2) ARGUS_RAY_EXTRA_ARGS="$head_args" setsid "$bin" run 2>"$dir/head.log" &
echo $! > "$dir/head.pid"
echo "head agent pid $(cat "$dir/head.pid"); waiting for the head to publish..."
until ARGUS_SHARED_ROOT=$dir/shared "$bin" head --json 2>/dev/null | grep -q '"state": "running"'; do
  kill -0 "$(cat "$dir/head.pid")" || { echo "head agent died: see $dir/head.log" >&2; exit 1; }
  sleep 1
done
sleep 5 # start nodes one after the other: they share one Ray session dir on one machine
env $(node_env worker 127.0.0.3) ARGUS_RAY_EXTRA_ARGS="$worker_args" setsid "$bin" run 2>"$dir/worker.log" &
echo $! > "$dir/worker.pid"
echo "worker agent pid $(cat "$dir/worker.pid"); waiting for both nodes in ray.nodes()..."
# Ray's token authentication is on: a driver needs the mode and the token
# (the head agent's copy in its state folder).
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$dir/state-head/auth_token
"$venv/bin/python" - <<PY
import ray, time
ray.init(address="127.0.0.2:$gcs_port", _node_ip_address="127.0.0.2", logging_level="ERROR")
for _ in range(120):
    alive = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    if alive == ["127.0.0.2", "127.0.0.3"]:
        break
    time.sleep(1)
print("alive nodes:", alive)
PY
echo "cluster up: RAY_ADDRESS=127.0.0.2:$gcs_port RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$dir/state-head/auth_token; logs in $dir; stop with: $0 stop"
