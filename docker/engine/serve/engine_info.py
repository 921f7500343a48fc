"""Reports which engine image this code runs in (used by the e2e tests)."""

import json
import os
import sys


def engine_info():
    """Returns the engine name and version baked into the image, and Ray's."""
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:  # pragma: no cover - the image always has Ray
        ray_version = None
    try:
        import vllm  # noqa: F401

        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = None
    return {
        "engine": os.environ.get("ARGUS_ENGINE_NAME"),
        "version": os.environ.get("ARGUS_ENGINE_VERSION"),
        "ray": ray_version,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "vllm": vllm_version,
        "hostname": os.uname().nodename,
    }


if __name__ == "__main__":
    print(json.dumps(engine_info()))
