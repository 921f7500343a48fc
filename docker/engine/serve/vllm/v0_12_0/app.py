"""The vLLM 0.12.0 OpenAI endpoint (import_path
``serve.vllm.v0_12_0.app:app_builder``): vLLM 0.12.0's own OpenAI server
in a Serve deployment, built by the shared ``serve.vllm.openai_app`` (its doc
lists the args). One module per vLLM version, so that a version whose API differs gets
its own without touching the others' endpoints."""

from serve.vllm.openai_app import build_app, require_vllm

VLLM_VERSION = "0.12.0"


def app_builder(args: dict):
    """Returns the Serve application for ``args`` (``{"model": <folder>, ...}``)."""
    require_vllm(VLLM_VERSION, __name__)
    return build_app(args)
