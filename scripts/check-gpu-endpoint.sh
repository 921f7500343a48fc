#!/usr/bin/env bash
# Checks a vLLM engine image on a GPU host, the way an endpoint uses it:
#
#   scripts/check-gpu-endpoint.sh IMAGE MODEL_DIR [MODEL_ID]
#
#   IMAGE      a GPU engine image, e.g. localhost/neutree/engine-vllm:v0.12.0-ray2.53.0
#              (scripts/build-images.sh engine --engine-version v0.12.0)
#   MODEL_DIR  a model folder on this host (config.json, weights, tokenizer)
#   MODEL_ID   the name clients use (default: the folder's name)
#
# Steps, each printed with its wall time; the first that fails ends the
# script with exit 1 and says why:
#   1. `nvidia-smi -L` on the host lists at least one GPU;
#   2. in a container of IMAGE with `--gpus all` (the option the shim allows
#      when the Ray container has the GPUs), torch sees CUDA and names the
#      GPU, and the image's vLLM version and serve module are found;
#   3. a single-node Ray in that container, `serve deploy` of the image's
#      serve module for that vLLM version with `num_gpus: 1` (Serve config
#      below), until RUNNING;
#   4. one chat completion and one streamed chat completion with the
#      official `openai` client (pinned in the image), printed.
# The container is removed at the end (KEEP=1 leaves it). MAX_MODEL_LEN
# bounds the context (vLLM's max_model_len; default the model's own, which a
# long-context model's KV cache may not fit on a small GPU). Options:
#   --cpu   run on a CPU engine image (…-cpu) without a GPU: no step 1, no
#           --gpus, torch need not see CUDA; to try the script on any box.
#
# It cannot run in this project's CI (no GPU there); the CPU path that CI runs
# is tests/engine_vllm.rs. Needs: docker, a GPU host with NVIDIA's container
# toolkit (for --gpus), the image on the host.
set -euo pipefail

cpu=0
args=()
for a in "$@"; do
  case $a in
    --cpu) cpu=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check-gpu-endpoint: unknown option $a (see --help)" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done
[ ${#args[@]} -ge 2 ] || { echo "check-gpu-endpoint: usage: $0 [--cpu] IMAGE MODEL_DIR [MODEL_ID]" >&2; exit 2; }
image=${args[0]}
model_dir=$(cd "${args[1]}" && pwd) || { echo "check-gpu-endpoint: no model folder ${args[1]}" >&2; exit 2; }
model_id=${args[2]:-$(basename "$model_dir")}
[ -f "$model_dir/config.json" ] || { echo "check-gpu-endpoint: $model_dir has no config.json (not a model folder)" >&2; exit 2; }
name=argus-check-endpoint-$$
port=${PORT:-18000}

t0=$(date +%s)
step() { printf 'check-gpu-endpoint: [%4ds] %s\n' $(( $(date +%s) - t0 )) "$*" >&2; }
fail() { step "FAILED: $*"; exit 1; }
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then step "KEEP=1: container $name left"; return; fi
  docker rm -f "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT

gpu_opts=()
if [ $cpu = 0 ]; then
  step "1. GPUs on this host"
  nvidia-smi -L || fail "nvidia-smi -L: no GPU or no NVIDIA driver on this host"
  gpu_opts=(--gpus all)
fi

step "2. engine container of $image"
docker image inspect "$image" >/dev/null || fail "image $image is not on this host"
docker run -d --name "$name" "${gpu_opts[@]}" --shm-size 2g -p "127.0.0.1:$port:8000" \
  -e RAY_USAGE_STATS_ENABLED=0 -e VLLM_CPU_KVCACHE_SPACE=1 \
  -v "$model_dir:/models/$model_id:ro" "$image" sleep infinity >/dev/null ||
  fail "docker run ${gpu_opts[*]} (is NVIDIA's container toolkit installed?)"
want_cuda=$([ $cpu = 0 ] && echo 1 || echo 0)
facts=$(docker exec "$name" python -c "
import json, sys, torch, vllm
cuda = torch.cuda.is_available()
out = {'torch': torch.__version__, 'cuda': cuda, 'vllm': vllm.__version__.split('+')[0],
       'gpus': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []}
print(json.dumps(out))
sys.exit(0 if cuda or not $want_cuda else 3)
") || fail "torch does not see a GPU in the engine container: $facts"
step "   $facts"
vllm_version=$(printf '%s' "$facts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["vllm"])')
module=v${vllm_version//./_}
docker exec "$name" python -c "import serve.vllm.$module.app" ||
  fail "the image has no serve module serve.vllm.$module for its vLLM $vllm_version"

step "3. Ray and serve deploy (serve.vllm.$module.app:app_builder, num_gpus $([ $cpu = 0 ] && echo 1 || echo 0))"
num_gpus=$([ $cpu = 0 ] && echo 1 || echo 0)
docker exec -i "$name" sh -c 'cat > /tmp/serve.yaml' <<EOF
proxy_location: HeadOnly
http_options: {host: 0.0.0.0, port: 8000}
applications:
  - name: llm
    route_prefix: /
    import_path: serve.vllm.$module.app:app_builder
    args:
      model: /models/$model_id
      model_id: $model_id
      engine_kwargs: {${MAX_MODEL_LEN:+max_model_len: $MAX_MODEL_LEN}}
    deployments:
      - name: VllmOpenAI
        num_replicas: 1
        health_check_timeout_s: 120
        ray_actor_options: {num_cpus: 1, num_gpus: $num_gpus}
EOF
docker exec "$name" ray start --head --disable-usage-stats --dashboard-host=127.0.0.1 --object-store-memory=500000000 >/dev/null ||
  fail "ray start in the engine container"
docker exec "$name" serve deploy /tmp/serve.yaml >/dev/null || fail "serve deploy"
deadline=$(( $(date +%s) + ${DEPLOY_TIMEOUT_S:-1200} ))
until docker exec "$name" serve status | grep -q 'status: RUNNING'; do
  if docker exec "$name" serve status | grep -qE 'DEPLOY_FAILED|status: UNHEALTHY'; then
    docker exec "$name" serve status >&2
    docker exec "$name" sh -c 'grep -h -E "^[A-Za-z_.]*(Error|Exception)[:(]|Value error" /tmp/ray/session_latest/logs/worker-*.err | grep -v "^RuntimeError: Traceback" | tail -n 5' >&2 || true
    fail "the application failed (the replica's errors above; KEEP=1 and docker exec $name ls /tmp/ray/session_latest/logs)"
  fi
  [ "$(date +%s)" -lt "$deadline" ] || fail "not RUNNING within ${DEPLOY_TIMEOUT_S:-1200} s"
  sleep 2
done
step "   RUNNING"

step "4. a chat completion with the openai client"
docker exec "$name" python -c "
import openai, sys
c = openai.OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='unused', max_retries=0, timeout=300)
r = c.chat.completions.create(model=sys.argv[1], max_tokens=32, temperature=0,
                              messages=[{'role': 'user', 'content': 'Say hello.'}])
print('answer:', repr(r.choices[0].message.content), r.usage)
s = c.chat.completions.create(model=sys.argv[1], max_tokens=32, temperature=0, stream=True,
                              messages=[{'role': 'user', 'content': 'Say hello.'}])
print('streamed:', repr(''.join(k.choices[0].delta.content or '' for k in s if k.choices)))
" "$model_id" || fail "the chat request"
step "OK: $image serves $model_id$([ $cpu = 0 ] && echo ' on the GPU')"
