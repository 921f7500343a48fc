"""A stand-in for the vLLM serve application (import_path
``serve.vllm.app:app_builder``).

With vLLM installed it would build the backend and controller deployments
for ``args["model"]``, loading weights from ``args["model_path"]`` with the
``VLLM_*`` settings of its environment; here the deployment answers with the
engine info plus what such an engine would see: its ``VLLM_*`` variables and
the files under ``model_path``. That is what tests need to see that the
request was served from inside this engine image, with the run options of
the deployment (docker/serve/*.yaml).
"""

import asyncio
import os
import time

from ray import serve

from serve.engine_info import engine_info

# The most of one model file the answer carries.
_MAX_FILE_BYTES = 4096


def _model_files(path):
    """Returns {name: text} of the regular files directly under ``path``
    (each cut to _MAX_FILE_BYTES), or {"error": ...} when it cannot be read."""
    if not path:
        return None
    try:
        out = {}
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            if os.path.isfile(full):
                with open(full, "rb") as f:
                    out[name] = f.read(_MAX_FILE_BYTES).decode("utf-8", "replace")
        return out
    except OSError as e:
        return {"error": repr(e)}


@serve.deployment
class EngineStub:
    def __init__(
        self,
        model: str = "stub",
        model_path: str = None,
        post_delay_s: float = 0,
        start_delay_s: float = 0,
    ):
        # A replica starts this long after its constructor is called, as an
        # engine loading its model does (the upgrade tests' cold start).
        time.sleep(float(start_delay_s or 0))
        self.model = model
        self.model_path = model_path
        # A POST takes this long, as an LLM answer does (the drain tests'
        # requests in flight).
        self.post_delay_s = float(post_delay_s or 0)

    async def __call__(self, request):
        if request.method == "POST" and self.post_delay_s > 0:
            await request.body()
            await asyncio.sleep(self.post_delay_s)
        info = engine_info()
        info["model"] = self.model
        info["model_path"] = self.model_path
        info["model_files"] = _model_files(self.model_path)
        info["env"] = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
        info["pid"] = os.getpid()
        return info


def app_builder(args: dict):
    """Returns the Serve application for ``args`` (``{"model": ...,
    "model_path": ..., "post_delay_s": ..., "start_delay_s": ...}``)."""
    args = args or {}
    return EngineStub.bind(
        model=args.get("model", "stub"),
        model_path=args.get("model_path"),
        post_delay_s=args.get("post_delay_s", 0),
        start_delay_s=args.get("start_delay_s", 0),
    )
