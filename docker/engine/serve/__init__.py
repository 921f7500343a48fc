"""Serve modules of the engine images (stand-in).

Ray Serve resolves an application's import_path, e.g.
``serve.vllm.app:app_builder``, inside the engine container; these modules are
what it finds there. The real modules come from the control plane's
repository; this package keeps the same shape so the container path can be
tested without vLLM or a GPU.
"""
