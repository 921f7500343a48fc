#!/usr/bin/env python
"""Checks a GPU engine image at build time, where there is no GPU:

    python check_gpu_wheel.py --vllm 0.12.0 --torch 2.9.0

- vLLM and torch are the versions asked for, and torch is a CUDA build;
- vLLM's compiled ops (vllm/_C.abi3.so and the other extension modules)
  find every shared library they link against, but the driver's
  libcuda.so.1, which the host's NVIDIA container runtime mounts at run time;
- vLLM imports (the serve modules' entry points are checked once they are
  in the image: serve.vllm.openai_app.check_entry_points).

Exits 1 naming what is wrong.
"""

import argparse
import glob
import importlib
import importlib.metadata
import os
import subprocess
import sys

# Provided by the host's driver at run time, not by the image.
DRIVER_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")


def fail(msg):
    print(f"check_gpu_wheel: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vllm", required=True)
    p.add_argument("--torch", required=True)
    a = p.parse_args()
    have = importlib.metadata.version("vllm")
    if have.split("+")[0] != a.vllm:
        fail(f"vllm is {have}, expected {a.vllm}")
    import torch

    if torch.__version__.split("+")[0] != a.torch:
        fail(f"torch is {torch.__version__}, expected {a.torch}")
    if not torch.version.cuda:
        fail(f"torch {torch.__version__} is not a CUDA build")
    root = os.path.dirname(importlib.util.find_spec("vllm").origin)
    libs = sorted(glob.glob(os.path.join(root, "**", "*.so"), recursive=True))
    if not any(os.path.basename(x).startswith("_C") for x in libs):
        fail(f"no compiled ops (_C*.so) under {root}")
    # torch's own libraries (libc10, libtorch_cuda, ...) are found through
    # the RPATH torch's extension loader sets up; ldd needs them on the path.
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(
        [torch_lib] + glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)),
                                             "nvidia", "*", "lib"))))
    for lib in libs:
        out = subprocess.run(["ldd", lib], capture_output=True, text=True, env=env).stdout
        missing = [line.split()[0] for line in out.splitlines()
                   if "not found" in line and line.split()[0] not in DRIVER_LIBS]
        if missing:
            fail(f"{os.path.relpath(lib, root)} links against missing {', '.join(missing)}")
    importlib.import_module("vllm")
    print(f"check_gpu_wheel: vllm {have}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{len(libs)} extension modules link")


if __name__ == "__main__":
    main()
