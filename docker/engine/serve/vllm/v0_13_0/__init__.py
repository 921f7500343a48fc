"""Serve modules for vLLM 0.13.0 engine images."""
