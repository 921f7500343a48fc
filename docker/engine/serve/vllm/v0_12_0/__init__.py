"""Serve modules for vLLM 0.12.0 engine images."""
