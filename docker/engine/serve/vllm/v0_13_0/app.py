"""The vLLM 0.13.0 OpenAI endpoint (import_path
``serve.vllm.v0_13_0.app:app_builder``): vLLM 0.13.0's own OpenAI server
in a Serve deployment, built by the shared ``serve.vllm.openai_app`` (its doc
lists the args). vLLM 0.13.0 keeps 0.12.0's entry points (``build_app``,
``init_app_state``, ``build_async_engine_client_from_engine_args``,
``make_arg_parser``), so this module only names its version."""

from serve.vllm.openai_app import build_app, require_vllm

VLLM_VERSION = "0.13.0"


def app_builder(args: dict):
    """Returns the Serve application for ``args`` (``{"model": <folder>, ...}``)."""
    require_vllm(VLLM_VERSION, __name__)
    return build_app(args)
