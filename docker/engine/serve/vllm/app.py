"""A stand-in for the vLLM serve application (import_path
``serve.vllm.app:app_builder``).

With vLLM installed it would build the backend and controller deployments;
here the deployment answers with the engine info, which is what tests need to
see that the request was served from inside this engine image.
"""

from ray import serve

from serve.engine_info import engine_info


@serve.deployment
class EngineStub:
    def __init__(self, model: str = "stub"):
        self.model = model

    async def __call__(self, request):
        info = engine_info()
        info["model"] = self.model
        return info


def app_builder(args: dict):
    """Returns the Serve application for ``args`` (``{"model": ...}``)."""
    return EngineStub.bind(model=(args or {}).get("model", "stub"))
