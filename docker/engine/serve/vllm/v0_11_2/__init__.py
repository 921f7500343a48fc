"""Serve modules for vLLM 0.11.2 engine images (GPU)."""
